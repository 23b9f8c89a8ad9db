"""Finding 8 of the security audit (crash loops): a rollout task that kept killing its workers is dead-lettered.

The counter of unfinished deliveries is real Redis state, as three workers
killed mid-task would have left it; the task body then never runs.
"""

from __future__ import annotations

import uuid

from tandem.contracts import dead_letter_stream, rollout_task_crashes_key
from workers.redelivery import MAX_CRASHED_DELIVERIES, crash_guard


def test_a_task_whose_deliveries_all_killed_their_worker_goes_to_the_dead_letters(redis_client, redis_url):
    task_id, run_id = str(uuid.uuid4()), 900_001
    redis_client.delete(dead_letter_stream(run_id))
    redis_client.set(rollout_task_crashes_key(task_id), MAX_CRASHED_DELIVERIES)  # three crashed deliveries

    ran = []
    with crash_guard(redis_url, task_id=task_id, run_id=run_id, what="groups 0..3") as guard:
        if not guard.dead_lettered:
            ran.append(True)

    assert ran == [] and guard.dead_lettered
    [(_, fields)] = redis_client.xrange(dead_letter_stream(run_id))
    assert fields[b"kind"] == b"rollout_task" and fields[b"task_id"] == task_id.encode()
    assert b"killed its worker" in fields[b"reason"]
    assert not redis_client.exists(rollout_task_crashes_key(task_id))
    redis_client.delete(dead_letter_stream(run_id))


def test_deliveries_that_end_leave_no_count_and_a_crashed_one_does(redis_client, redis_url):
    task_id = str(uuid.uuid4())
    for _ in range(MAX_CRASHED_DELIVERIES + 2):  # ended deliveries (retries, errors) never add up
        try:
            with crash_guard(redis_url, task_id=task_id, run_id=1, what="g") as guard:
                assert not guard.dead_lettered
                raise RuntimeError("a task error, or Celery's Retry")
        except RuntimeError:
            pass
    assert not redis_client.exists(rollout_task_crashes_key(task_id))

    # A worker killed mid-task never reaches the end of the block: the count stays.
    guard_context = crash_guard(redis_url, task_id=task_id, run_id=1, what="g")
    guard_context.__enter__()
    assert int(redis_client.get(rollout_task_crashes_key(task_id))) == 1
    redis_client.delete(rollout_task_crashes_key(task_id))
