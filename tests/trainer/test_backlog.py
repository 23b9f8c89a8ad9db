"""Rollout requests ahead of the trainer, against a real Redis (Celery replaced by a recorder)."""

import random

import pytest

from tandem.configs.rollout import RolloutConfig
from tandem.contracts import ROLLOUT_QUEUE, ROLLOUT_TASK_NAME
from trainer.backlog import RolloutBacklog


class _RecordingCelery:
    def __init__(self):
        self.sent = []

    def send_task(self, name, *, args, queue):
        self.sent.append((name, tuple(args), queue))


def _backlog(redis_client, run_id, *, max_staleness=None, groups_needed=10_000, **config):
    celery = _RecordingCelery()
    backlog = RolloutBacklog(celery_app=celery, redis_client=redis_client, run_id=run_id,
                             config=RolloutConfig(max_staleness=max_staleness, **config), groups_needed=groups_needed)
    return backlog, celery


def test_without_a_staleness_bound_the_backlog_keeps_backlog_plus_one_steps_requested(redis_client, run_id):
    backlog, celery = _backlog(redis_client, run_id, groups_per_step=4, groups_per_task=2,
                               backlog_steps=4)
    assert backlog.top_up(groups_consumed=0) == 10
    assert backlog.groups_requested == 20
    assert celery.sent[0] == (ROLLOUT_TASK_NAME, (run_id, 0, 2), ROLLOUT_QUEUE)
    assert celery.sent[-1][1] == (run_id, 18, 2)


def test_the_staleness_bound_caps_groups_requested_and_not_consumed(redis_client, run_id):
    backlog, _ = _backlog(redis_client, run_id, max_staleness=1, groups_per_step=4, groups_per_task=2,
                          backlog_steps=4)
    backlog.top_up(groups_consumed=0)
    assert backlog.groups_requested == 8  # (1 + 1) * 4, not the (4 + 1) * 4 the backlog alone asks for
    backlog.top_up(groups_consumed=3)
    assert backlog.groups_requested == 10


def test_tasks_never_overshoot_the_staleness_bound(redis_client, run_id):
    rng = random.Random(0)
    backlog, _ = _backlog(redis_client, run_id, max_staleness=2, groups_per_step=4, groups_per_task=3,
                          backlog_steps=8)
    bound = (2 + 1) * 4
    consumed = 0
    for _ in range(200):
        backlog.top_up(groups_consumed=consumed)
        outstanding = backlog.groups_requested - consumed
        assert outstanding <= bound
        assert outstanding > bound - 3  # and it fills up to within one task of it
        consumed += rng.randint(0, outstanding)


def test_a_task_larger_than_the_staleness_bound_is_refused(redis_client, run_id):
    with pytest.raises(ValueError, match="groups_per_task"):
        _backlog(redis_client, run_id, max_staleness=0, groups_per_step=2, groups_per_task=4)


def test_groups_never_delivered_expire_as_lost_and_are_requested_again(redis_client, run_id):
    backlog, celery = _backlog(redis_client, run_id, max_staleness=1, groups_per_step=2, groups_per_task=1,
                               backlog_steps=1, groups_needed=4)
    backlog.top_up(groups_consumed=0)
    assert backlog.groups_requested == 4
    backlog.settle([f"{run_id}-0", f"{run_id}-1"])  # delivered and trained
    assert backlog.expire(timeout_s=3600) == []
    lost = backlog.expire(timeout_s=0, now=float("inf"))
    assert lost == [f"{run_id}-2", f"{run_id}-3"] and backlog.groups_lost == 2
    # Counted as consumed, the lost groups free their room and are replaced.
    backlog.top_up(groups_consumed=4)
    assert backlog.groups_requested == 8  # 4 consumed (2 trained, 2 lost) + (1 + 1) steps of 2


def test_episodes_of_a_refused_group_are_handed_back_and_stragglers_are_duplicates(redis_client, run_id):
    import time

    from tandem.contracts import EpisodeTimings, TrajectoryRecord
    from trainer.stream import GroupAssembler, StreamEntry

    def entry(entry_id, group):
        now = time.time()
        return StreamEntry(entry_id, TrajectoryRecord(
            run_id=run_id, group_id=group, group_size=2, environment="e", policy_version=0,
            token_ids=[1], behaviour_logprobs=[0.0], loss_mask=[0], reward=0.0,
            timings=EpisodeTimings(started_at=now, finished_at=now, generation_s=0, environment_s=0)))

    assembler = GroupAssembler()
    assembler.add(entry("1-0", "lost"))
    (held,) = assembler.refuse_groups(["lost"])
    assert [e.entry_id for e in held] == ["1-0"]
    assembler.add(entry("2-0", "lost"))
    assert assembler.complete_groups() == 0 and assembler.take_duplicates() == ["2-0"]
