"""Celery tasks of rollout producers: thin wrappers that take IDs."""

from __future__ import annotations

import dataclasses

from tandem.contracts import (
    PLATFORM_QUEUE,
    PROBE_QUEUE,
    PROBE_REPORT_TASK_NAME,
    PROBE_TASK_NAME,
    ROLLOUT_QUEUE,
    ROLLOUT_TASK_NAME,
)
from workers.app import app
from workers.probe import probe_by_id
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


@app.task(
    name=PROBE_TASK_NAME,
    queue=PROBE_QUEUE,
    # The probe's own per-check timeouts are what hold: the threads pool enforces
    # no Celery time limit. These bound it under prefork, above the sum of the
    # default check timeouts (ProbeTimeouts: 10 + 60 + 60 + 20 + 10 + 20 + 10 seconds).
    soft_time_limit=240,
    time_limit=300,
)
def probe_environment(probe_id: int) -> None:
    """Probe the environment version the platform asked about under ``probe_id``; report back."""
    report = probe_by_id(redis_url=redis_url(), probe_id=probe_id)
    # The platform's worker has the database; the rollout worker needs only Redis.
    app.send_task(PROBE_REPORT_TASK_NAME, args=[report.model_dump(mode="json")], queue=PLATFORM_QUEUE)
