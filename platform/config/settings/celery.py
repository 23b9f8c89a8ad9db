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
