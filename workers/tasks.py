"""Celery tasks of rollout producers: thin wrappers that take IDs."""

from __future__ import annotations

import dataclasses

from tandem.contracts import ROLLOUT_QUEUE, ROLLOUT_TASK_NAME
from workers.app import app
from workers.producer import RunNotReadyError, produce
from workers.settings import redis_url


@app.task(
    name=ROLLOUT_TASK_NAME,
    queue=ROLLOUT_QUEUE,
    bind=True,
    autoretry_for=(RunNotReadyError,),
    retry_backoff=1,
    retry_backoff_max=10,
    max_retries=30,
)
def produce_rollouts(self, run_id: int, first_group_index: int, num_groups: int) -> dict:
    """Run ``num_groups`` episode groups of run ``run_id``, starting at ``first_group_index``."""
    summary = produce(
        redis_url=redis_url(), run_id=run_id, first_group_index=first_group_index, num_groups=num_groups
    )
    return dataclasses.asdict(summary)
