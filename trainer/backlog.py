"""Keeping rollout tasks requested ahead of the trainer, so it never waits on generation.

With ``max_staleness`` set, the same counter is also admission control: the
groups requested and not yet consumed (queued in Celery, being generated, or
waiting in the stream) never exceed ``(max_staleness + 1) * groups_per_step``,
so producers never start work the trainer would have to drop as too stale.
"""

from __future__ import annotations

import time
from collections import OrderedDict

import redis
from celery import Celery

from tandem.contracts import ROLLOUT_QUEUE, ROLLOUT_TASK_NAME, run_group_counter_key
from tandem.rollout_config import RolloutConfig


class RolloutBacklog:
    """Requests rollout tasks by name; a group's index comes from a per-run Redis counter.

    ``config.max_staleness`` (policy versions; None: no bound) caps the
    outstanding groups; the config has checked that one task fits within it.
    ``clock`` (monotonic seconds) times the requests :meth:`expire` gives up on; injectable for tests.
    """

    def __init__(self, *, celery_app: Celery, redis_client: redis.Redis, run_id: int, config: RolloutConfig,
                 groups_needed: int, clock=time.monotonic):
        self._celery = celery_app
        self._clock = clock
        self._redis = redis_client
        self._run_id = run_id
        self._config = config
        # Headroom for groups lost to failures or dead producers. The cap is on the
        # run's group counter, which a resumed trainer finds past zero (see adopt).
        self._groups_cap = groups_needed + config.groups_per_step * config.backlog_steps
        self.tasks_sent = 0
        # Group index -> when it was requested, until it is settled (consumed) or expires as lost.
        self._unsettled: OrderedDict[int, float] = OrderedDict()
        self.groups_lost = 0
        self.max_staleness = config.max_staleness

    @property
    def outstanding_groups_bound(self) -> int | None:
        """Most groups requested and not yet consumed (None: unbounded beyond the backlog)."""
        if self.max_staleness is None:
            return None
        return (self.max_staleness + 1) * self._config.groups_per_step

    def extend(self, *, groups: int) -> None:
        """Allow ``groups`` more groups in total: replacements of groups consumed untrained, or lost."""
        self._groups_cap += groups

    @property
    def groups_requested(self) -> int:
        return int(self._redis.get(run_group_counter_key(self._run_id)) or 0)

    def top_up(self, *, groups_consumed: int, steps_ahead: int | None = None) -> int:
        """Request groups until (backlog + 1) steps' worth are outstanding; returns tasks sent.

        ``groups_consumed``: groups taken off the stream so far, trained on or
        dropped. ``steps_ahead``: steps requested beyond the current one
        (default ``backlog_steps``; 0 is the synchronous pipeline). Under ``max_staleness`` a task is sent only if all of its
        groups fit within the bound, so the bound holds exactly.
        """
        config = self._config
        if steps_ahead is None:
            steps_ahead = config.backlog_steps
        target = groups_consumed + (steps_ahead + 1) * config.groups_per_step
        target = min(target, self._groups_cap)
        bound = self.outstanding_groups_bound
        sent = 0
        requested = self.groups_requested
        while requested < target:
            if bound is not None and requested + config.groups_per_task > groups_consumed + bound:
                break
            # The counter hands out group index ranges, so two trainers never reuse a group id.
            end = self._redis.incrby(run_group_counter_key(self._run_id), config.groups_per_task)
            first = end - config.groups_per_task
            self._celery.send_task(
                ROLLOUT_TASK_NAME, args=[self._run_id, first, config.groups_per_task], queue=ROLLOUT_QUEUE
            )
            requested = end
            sent += 1
            now = self._clock()
            for group_index in range(first, end):
                self._unsettled[group_index] = now
        self.tasks_sent += sent
        return sent

    def adopt(self, group_indices, *, groups_consumed: int) -> None:
        """Take over from an earlier trainer of the run: track the groups it requested, as if requested now.

        ``groups_consumed``: of the groups the run requested, those settled
        before (trained on, dropped or lost); the cap moves past them.
        ``group_indices``: the open ones; a resumed trainer waits for them like
        for its own, and counts them lost if they never complete within ``timeout_s``.
        """
        self.extend(groups=groups_consumed)
        now = self._clock()
        for group_index in group_indices:
            self._unsettled[group_index] = now

    def settle(self, group_ids) -> None:
        """Groups that were consumed (trained on or dropped) are no longer at risk of being lost."""
        for group_id in group_ids:
            self._unsettled.pop(group_index_of(group_id), None)

    def expire(self, *, timeout_s: float, now: float | None = None) -> list[str]:
        """Group ids requested over ``timeout_s`` ago and never consumed: lost with a dead producer.

        The caller counts them as consumed (so admission control frees their
        room) and refuses their late episodes; the backlog asks for as many
        replacement groups.
        """
        now = self._clock() if now is None else now
        lost = [index for index, requested_at in self._unsettled.items() if now - requested_at > timeout_s]
        for index in lost:
            del self._unsettled[index]
        self.groups_lost += len(lost)
        self.extend(groups=len(lost))
        return [f"{self._run_id}-{index}" for index in lost]


def group_index_of(group_id: str) -> int:
    """The counter index a producer's group id (``<run_id>-<index>``) was made from."""
    return int(group_id.rsplit("-", 1)[1])
