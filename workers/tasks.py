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
from workers.redelivery import crash_guard
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
    """Run ``num_groups`` episode groups of run ``run_id``, starting at ``first_group_index``.

    A task whose earlier deliveries each killed their worker (out of memory, say: acks_late
    redelivers it) goes to the run's dead letters after MAX_CRASHED_DELIVERIES instead of
    crash-looping every worker (workers.redelivery).
    """
    with crash_guard(redis_url(), task_id=self.request.id, run_id=run_id,
                     what=f"groups {first_group_index}..{first_group_index + num_groups - 1}") as guard:
        if guard.dead_lettered:
            return {"run_id": run_id, "dead_lettered": True, "reason": guard.reason}
        summary = produce(
            redis_url=redis_url(), run_id=run_id, first_group_index=first_group_index,
            num_groups=num_groups,
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
