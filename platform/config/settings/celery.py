"""Celery, as configured for the platform's own app (config/celery.py)."""

from .environment import REDIS_URL, env_str

CELERY_BROKER_URL = REDIS_URL
# The platform's tasks never share a queue with the rollout producers' queue.
CELERY_TASK_DEFAULT_QUEUE = "platform"
# Platform tasks report through the database, never through Celery results.
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_TIME_LIMIT = 300
CELERY_TASK_SOFT_TIME_LIMIT = 240
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# Celery beat (run embedded in the platform worker: `celery -A config.celery
# worker --beat --queues platform`, which `tandem up` starts) sends the health
# sweep; it probes every version in use again and marks failures unhealthy.
CELERY_BEAT_SCHEDULE = {
    "environment-health-sweep": {
        "task": "tandem.environments.health_sweep",
        "schedule": float(env_str("TANDEM_HEALTH_CHECK_INTERVAL_S", "60")),
        "options": {"queue": CELERY_TASK_DEFAULT_QUEUE, "expires": 60},
    },
}
