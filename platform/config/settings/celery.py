"""Celery, as configured for the platform's own app (config/celery.py)."""

from .environment import REDIS_URL

CELERY_BROKER_URL = REDIS_URL
# The platform's tasks never share a queue with the rollout producers' queue.
CELERY_TASK_DEFAULT_QUEUE = "platform"
# Platform tasks report through the database, never through Celery results.
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_TIME_LIMIT = 300
CELERY_TASK_SOFT_TIME_LIMIT = 240
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

from .environment import env_float  # noqa: E402

# A trainer heartbeats every 2 s; a minute of silence means it is gone, not slow
# (a checkpoint or a compile never blocks the loop that long).
TANDEM_TRAINER_HEARTBEAT_TIMEOUT_S = env_float("TANDEM_TRAINER_HEARTBEAT_TIMEOUT_S", 60.0)
# The reaper's period: a dead trainer's run is failed at most timeout + period after its last heartbeat.
TANDEM_REAPER_INTERVAL_S = env_float("TANDEM_REAPER_INTERVAL_S", 10.0)
CELERY_BEAT_SCHEDULE = {
    "reap-dead-trainers": {
        "task": "tandem.platform.reap_dead_trainers",
        "schedule": TANDEM_REAPER_INTERVAL_S,
        "options": {"queue": "platform", "expires": TANDEM_REAPER_INTERVAL_S},
    },
}
