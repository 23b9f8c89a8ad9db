"""Where producers find Redis; one variable, shared with the trainer and platform."""

import os

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


# Longest a rollout task runs before its episodes are cancelled (workers/producer.py), also capped
# by its run's rollout.timeout_s. Celery's threads pool enforces no time limit of its own.
ROLLOUT_TASK_TIME_LIMIT_S = 900.0


def redis_url() -> str:
    return os.environ.get("REDIS_URL", DEFAULT_REDIS_URL)


def task_concurrency() -> int:
    """Rollout tasks this process runs at once (``tandem worker --concurrency``); 1 outside a worker."""
    return max(int(os.environ.get("TANDEM_WORKER_CONCURRENCY", "1")), 1)
