"""Celery, as configured for the platform's own app (config/celery.py)."""

from tandem.contracts import WEBHOOKS_QUEUE

from .env_vars import REDIS_URL, env_float, env_str

CELERY_BROKER_URL = REDIS_URL
# The platform's tasks never share a queue with the rollout producers' queue.
CELERY_TASK_DEFAULT_QUEUE = "platform"
# Platform tasks report through the database, never through Celery results.
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_TIME_LIMIT = 300
CELERY_TASK_SOFT_TIME_LIMIT = 240
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# A trainer heartbeats every 2 s; a minute of silence means it is gone, not slow
# (a checkpoint or a compile never blocks the loop that long).
TANDEM_TRAINER_HEARTBEAT_TIMEOUT_S = env_float("TANDEM_TRAINER_HEARTBEAT_TIMEOUT_S", 60.0)
# The reaper's period: a dead trainer's run is restarted (or failed) at most timeout + period after
# its last heartbeat. The progress watchdog runs as often.
TANDEM_REAPER_INTERVAL_S = env_float("TANDEM_REAPER_INTERVAL_S", 10.0)
# How often the platform stores what the runs' trainers and producers logged: the lag of the run
# page's live log (one XINFO and XRANGE per run that may still log).
TANDEM_RUN_LOG_DRAIN_INTERVAL_S = env_float("TANDEM_RUN_LOG_DRAIN_INTERVAL_S", 2.0)
# Celery beat (run embedded in the platform worker: `tandem platform-worker`,
# which `tandem up` starts) sends the reaper and the environment health sweep,
# which probes every version in use again and marks failures unhealthy.
CELERY_BEAT_SCHEDULE = {
    "reap-dead-trainers": {
        "task": "tandem.platform.reap_dead_trainers",
        "schedule": TANDEM_REAPER_INTERVAL_S,
        "options": {"queue": CELERY_TASK_DEFAULT_QUEUE, "expires": TANDEM_REAPER_INTERVAL_S},
    },
    # The progress watchdog: flags running runs whose step stopped advancing (config.stall_timeout_s).
    "flag-stalled-runs": {
        "task": "tandem.platform.flag_stalled_runs",
        "schedule": TANDEM_REAPER_INTERVAL_S,
        "options": {"queue": CELERY_TASK_DEFAULT_QUEUE, "expires": TANDEM_REAPER_INTERVAL_S},
    },
    "drain-run-logs": {
        "task": "tandem.platform.drain_run_logs",
        "schedule": TANDEM_RUN_LOG_DRAIN_INTERVAL_S,
        "options": {"queue": CELERY_TASK_DEFAULT_QUEUE, "expires": TANDEM_RUN_LOG_DRAIN_INTERVAL_S},
    },
    # Webhook deliveries whose worker was killed mid-post (alerts.services.webhook_deliveries_resume).
    "resume-abandoned-webhook-deliveries": {
        "task": "tandem.alerts.resume_abandoned_webhook_deliveries",
        "schedule": 60.0,
        "options": {"queue": WEBHOOKS_QUEUE, "expires": 60},
    },
    "environment-health-sweep": {
        "task": "tandem.environments.health_sweep",
        "schedule": float(env_str("TANDEM_HEALTH_CHECK_INTERVAL_S", "60")),
        "options": {"queue": CELERY_TASK_DEFAULT_QUEUE, "expires": 60},
    },
}
