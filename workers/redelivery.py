"""Rollout tasks that keep killing their worker: counted, and sent to the run's dead letters.

Rollout tasks are acknowledged late, so a task whose worker dies mid-way (the
kernel's OOM killer, a segfault in environment code) is delivered again. One
that kills every worker it reaches would crash-loop the whole pool. Each
delivery increments a counter in Redis, and a delivery that ends (well, with an
error, or with a Celery retry) deletes it, so the counter holds the deliveries
that never ended. Past ``MAX_CRASHED_DELIVERIES`` the task is not run again:
it is recorded in the run's dead-letter stream with its reason, and logged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator

from tandem.contracts import dead_letter_stream, rollout_task_crashes_key
from tandem.runtime.redis_clients import durable_redis

logger = logging.getLogger(__name__)

# Deliveries of one task that may kill their worker before it is dead-lettered.
MAX_CRASHED_DELIVERIES = 3
# A counter outlives any sensible redelivery delay (Celery's visibility timeout is hours).
_COUNTER_TTL_S = 7 * 24 * 3600
_DEAD_LETTER_MAXLEN = 10_000


@dataclasses.dataclass
class Guard:
    dead_lettered: bool = False
    reason: str = ""


@contextlib.contextmanager
def crash_guard(redis_url: str, *, task_id: str, run_id: int, what: str) -> Iterator[Guard]:
    """Count this delivery of ``task_id``; dead-letter it instead if its earlier ones all crashed."""
    client = durable_redis(redis_url)
    key = rollout_task_crashes_key(task_id)
    try:
        with client.pipeline(transaction=True) as pipe:
            crashed = pipe.incr(key).expire(key, _COUNTER_TTL_S).execute()[0] - 1
        guard = Guard()
        if crashed >= MAX_CRASHED_DELIVERIES:
            guard.dead_lettered = True
            guard.reason = (f"rollout task {task_id} ({what}) was delivered {crashed + 1} times and "
                            f"each of the first {crashed} deliveries killed its worker (out of memory?); "
                            "it is not run again")
            logger.error("run %s: %s", run_id, guard.reason)
            with client.pipeline(transaction=True) as pipe:
                pipe.xadd(dead_letter_stream(run_id),
                          {"kind": "rollout_task", "task_id": task_id, "reason": guard.reason},
                          maxlen=_DEAD_LETTER_MAXLEN, approximate=True)
                pipe.delete(key)
                pipe.execute()
            yield guard
            return
        try:
            yield guard
        finally:
            client.delete(key)  # this delivery ended: it did not kill its worker
    finally:
        client.close()
