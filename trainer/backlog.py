"""Keeping rollout tasks requested ahead of the trainer, so it never waits on generation."""

from __future__ import annotations

import redis
from celery import Celery

from tandem.contracts import ROLLOUT_QUEUE, ROLLOUT_TASK_NAME, run_group_counter_key
from tandem.run_config import RunConfig


class RolloutBacklog:
    def __init__(self, *, celery_app: Celery, redis_client: redis.Redis, run_id: int, config: RunConfig,
                 groups_needed: int):
        self._celery = celery_app
        self._redis = redis_client
        self._run_id = run_id
        self._config = config
        # Headroom for groups lost to failures or dead producers.
        self._groups_cap = groups_needed + config.groups_per_step * config.rollout_backlog_steps
        self.tasks_sent = 0

    def extend(self, *, groups: int) -> None:
        """Allow ``groups`` more groups in total, replacing groups that were dropped unused."""
        self._groups_cap += groups

    @property
    def groups_requested(self) -> int:
        return int(self._redis.get(run_group_counter_key(self._run_id)) or 0)

    def top_up(self, *, groups_consumed: int) -> int:
        """Request groups until (backlog + 1) steps' worth are outstanding; returns tasks sent."""
        config = self._config
        target = groups_consumed + (config.rollout_backlog_steps + 1) * config.groups_per_step
        target = min(target, self._groups_cap)
        sent = 0
        while self.groups_requested < target:
            # The counter hands out group index ranges, so two trainers never reuse a group id.
            end = self._redis.incrby(run_group_counter_key(self._run_id), config.groups_per_task)
            first = end - config.groups_per_task
            self._celery.send_task(
                ROLLOUT_TASK_NAME, args=[self._run_id, first, config.groups_per_task], queue=ROLLOUT_QUEUE
            )
            sent += 1
        self.tasks_sent += sent
        return sent
