"""Celery, as configured for the platform's own app (config/celery.py)."""

from tandem.contracts import (
    ADVANCE_SWEEPS,
    DRAIN_RUN_LOGS,
    EXPIRE_CHECKPOINT_EXPORTS,
    FLAG_STALLED_RUNS,
    HEALTH_SWEEP,
    PLATFORM_QUEUE,
    REAP_DEAD_TRAINERS,
    WEBHOOK_RESUME,
    TaskRoute,
    task_routes,
)

from .env_vars import REDIS_URL, env_float, env_str

CELERY_BROKER_URL = REDIS_URL
# The platform's tasks never share a queue with the rollout producers' queue.
CELERY_TASK_DEFAULT_QUEUE = PLATFORM_QUEUE
# Every task to its queue, from the one table (tandem.contracts.tasks): senders name no queue.
CELERY_TASK_ROUTES = task_routes()
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


def _every(route: TaskRoute, interval_s: float, *, expires_s: float | None = None) -> dict:
    """A beat entry: ``route``'s task to its queue every ``interval_s``, dropped if unsent after ``expires_s``
    (default: the interval)."""
    return {"task": route.name, "schedule": interval_s,
            "options": {"queue": route.queue, "expires": interval_s if expires_s is None else expires_s}}


# Celery beat (run embedded in the platform worker: `tandem platform-worker`,
# which `tandem up` starts) sends the reaper and the environment health sweep,
# which probes every version in use again and marks failures unhealthy.
CELERY_BEAT_SCHEDULE = {
    "reap-dead-trainers": _every(REAP_DEAD_TRAINERS, TANDEM_REAPER_INTERVAL_S),
    # The progress watchdog: flags running runs whose step stopped advancing (config.stall_timeout_s).
    "flag-stalled-runs": _every(FLAG_STALLED_RUNS, TANDEM_REAPER_INTERVAL_S),
    "drain-run-logs": _every(DRAIN_RUN_LOGS, TANDEM_RUN_LOG_DRAIN_INTERVAL_S),
    # Sweeps: report their trials' new steps to the study, prune, start the next runs (sweeps.services).
    "advance-sweeps": _every(ADVANCE_SWEEPS, env_float("TANDEM_SWEEP_INTERVAL_S", 10.0)),
    # Webhook deliveries whose worker was killed mid-post (alerts.services.webhook_deliveries_resume).
    "resume-abandoned-webhook-deliveries": _every(WEBHOOK_RESUME, 60.0),
    # Exports no export worker reported in time (checkpoints.services.checkpoint_exports_expire).
    "expire-checkpoint-exports": _every(EXPIRE_CHECKPOINT_EXPORTS, 60.0),
    "environment-health-sweep": _every(HEALTH_SWEEP, float(env_str("TANDEM_HEALTH_CHECK_INTERVAL_S", "60")),
                                       expires_s=60),
}
