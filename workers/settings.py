"""Where producers find Redis (one variable, $REDIS_URL, shared with the trainer and platform), and their limits."""

import os

from tandem.runtime.process_start import redis_url as _process_redis_url

# Longest a rollout task runs before its episodes are cancelled (workers/producer.py), also capped
# by its run's rollout.timeout_s. Celery's threads pool enforces no time limit of its own.
ROLLOUT_TASK_TIME_LIMIT_S = 900.0


def redis_url() -> str:
    """``$REDIS_URL``, else Tandem's default (tandem/runtime/process_start.py)."""
    return _process_redis_url()


def task_concurrency() -> int:
    """Rollout tasks this process runs at once (``tandem worker --concurrency``); 1 outside a worker."""
    return max(int(os.environ.get("TANDEM_WORKER_CONCURRENCY", "1")), 1)
