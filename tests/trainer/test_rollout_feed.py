"""The rollout feed against a real Redis (Celery replaced by a recorder); no model, no JAX."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tandem.configs.rollout import RolloutConfig
from tandem.configs.run import RunConfig
from tandem.contracts import (
    ROLLOUT_QUEUE,
    ROLLOUT_TASK_NAME,
    TRAINER_CONSUMER_GROUP,
    EpisodeTimings,
    LineageEntry,
    ProducerFault,
    TrajectoryRecord,
    consumed_groups_key,
    lineage_stream,
    producer_fault_key,
    trajectory_stream,
)
from trainer.rollout_feed import ProducerFaultError, RolloutFeed

REPO_ROOT = Path(__file__).resolve().parents[2]


class _RecordingCelery:
    def __init__(self):
        self.sent = []

    def send_task(self, name, *, args, queue):
        self.sent.append((name, tuple(args), queue))

    def first_groups(self) -> list[int]:
        """The first group index of each task sent."""
        return [args[1] for _, args, _ in self.sent]


class _Clock:
    """Monotonic seconds that move only when a test says so."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _feed(redis_client, run_id, *, consumer="trainer-a", rl_steps_left=10, clock=None, **rollout):
    rollout = {"groups_per_step": 2, "group_size": 2, "groups_per_task": 1, "backlog_steps": 1, **rollout}
    celery = _RecordingCelery()
    feed = RolloutFeed(redis_client=redis_client, celery_app=celery, run_id=run_id,
                       config=RunConfig(rollout=RolloutConfig(**rollout)), consumer=consumer,
                       rl_steps_left=rl_steps_left, block_ms=10, clock=clock or _Clock())
    return feed, celery


def _group(run_id: int, index: int) -> str:
    return f"{run_id}-{index}"


def _record(run_id: int, index: int, *, policy_version: int = 0) -> TrajectoryRecord:
    now = time.time()
    return TrajectoryRecord(
        run_id=run_id, group_id=_group(run_id, index), group_size=2, environment="calculator",
        policy_version=policy_version, policy_versions=[policy_version], token_ids=[1, 2, 3],
        behaviour_logprobs=[0.0, -0.5, -0.7], loss_mask=[0, 1, 1], reward=1.0,
        timings=EpisodeTimings(started_at=now, finished_at=now, generation_s=0.0, environment_s=0.0),
    )


def _append(redis_client, run_id: int, *records: TrajectoryRecord) -> list[str]:
    return [redis_client.xadd(trajectory_stream(run_id), r.to_stream_fields()).decode() for r in records]


def _pending(redis_client, run_id: int) -> set[str]:
    rows = redis_client.xpending_range(trajectory_stream(run_id), TRAINER_CONSUMER_GROUP, "-", "+", 1000)
    return {row["message_id"].decode() for row in rows}


def _lineage(redis_client, run_id: int) -> list[LineageEntry]:
    return [LineageEntry.from_stream_fields(fields) for _, fields in redis_client.xrange(lineage_stream(run_id))]


def _consumed(redis_client, run_id: int, group_ids: list[str]) -> list[bool]:
    return [score is not None for score in redis_client.zmscore(consumed_groups_key(run_id), group_ids)]


def test_the_feed_imports_no_jax():
    code = ("import sys, trainer.rollout_feed\n"
            "print(sorted(name for name in ('jax', 'flax', 'optax', 'orbax') if name in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_a_step_gets_whole_groups_assembled_across_reads_and_the_next_steps_requested_ahead(redis_client, run_id):
    feed, celery = _feed(redis_client, run_id)
    _append(redis_client, run_id, _record(run_id, 0), _record(run_id, 1))
    reads = []

    def between_reads():
        reads.append(len(celery.sent))
        if len(reads) == 1:  # the other halves arrive after the first read
            _append(redis_client, run_id, _record(run_id, 1), _record(run_id, 0))

    taken = feed.next_step(after_step=0, policy_version=0, between_reads=between_reads)
    assert len(reads) == 2
    assert taken.group_ids == [_group(run_id, 0), _group(run_id, 1)]
    assert [[record.group_id for record in group] for group in taken.trajectories] == [
        [_group(run_id, 0)] * 2, [_group(run_id, 1)] * 2]
    # (backlog 1 + 1) steps of 2 groups before the wait. While the step trains, its groups still
    # count against the backlog: the next ones are asked for once its update is published.
    assert reads == [4, 4]
    assert celery.first_groups() == [0, 1, 2, 3]
    assert celery.sent[0] == (ROLLOUT_TASK_NAME, (run_id, 0, 1), ROLLOUT_QUEUE)
    feed.trained(taken, kept=taken.records, step=1, policy_version=1)
    _append(redis_client, run_id, *(_record(run_id, index, policy_version=1) for index in (2, 2, 3, 3)))
    feed.next_step(after_step=1, policy_version=1)
    assert celery.first_groups() == [0, 1, 2, 3, 4, 5]


def test_with_producers_to_spare_no_group_is_requested_that_would_arrive_too_stale(redis_client, run_id):
    """Producers that finish every requested group at once, with the newest published policy,
    and a trainer that takes them in order: the staleness bound admits only groups it can train.

    Counting the groups of the step being trained as already consumed, one step of groups too
    many was requested during every update, each to be dropped three versions old.
    """
    max_staleness = 2
    feed, celery = _feed(redis_client, run_id, groups_per_step=2, backlog_steps=max_staleness,
                         max_staleness=max_staleness, rl_steps_left=12)
    produced = 0
    published = 0

    def produce_what_was_asked():
        nonlocal produced
        for first in celery.first_groups()[produced:]:
            _append(redis_client, run_id, *(_record(run_id, first, policy_version=published) for _ in range(2)))
        produced = len(celery.sent)

    staleness = []
    for step in range(10):
        taken = feed.next_step(after_step=step, policy_version=published, between_reads=produce_what_was_asked)
        produce_what_was_asked()  # generated while the update runs, by the policy it starts from
        staleness += [published - record.policy_version for record in taken.records]
        published += 1
        feed.trained(taken, kept=taken.records, step=step + 1, policy_version=published)
        fields = feed.step_fields(wall_s=1.0)
        assert fields["stale_groups_dropped"] == 0, f"step {step + 1}"
    # The bound is used to the full: the last steps train on groups max_staleness versions old.
    assert max(staleness) == max_staleness


def test_the_sync_pipeline_requests_a_steps_groups_only_when_the_step_asks_for_them(redis_client, run_id):
    feed, celery = _feed(redis_client, run_id, pipeline="sync")
    _append(redis_client, run_id, *(_record(run_id, index) for index in (0, 0, 1, 1)))
    taken = feed.next_step(after_step=0, policy_version=0)
    assert celery.first_groups() == [0, 1]
    feed.trained(taken, kept=taken.records, step=1, policy_version=1)
    assert celery.first_groups() == [0, 1]  # nothing is generated ahead of the update
    sent_while_waiting = []

    def between_reads():
        sent_while_waiting.append(celery.first_groups())
        _append(redis_client, run_id, *(_record(run_id, index, policy_version=1) for index in (2, 2, 3, 3)))

    feed.next_step(after_step=1, policy_version=1, between_reads=between_reads)
    assert sent_while_waiting[0] == [0, 1, 2, 3]


def test_duplicate_episodes_and_redelivered_groups_are_acknowledged_and_never_trained(redis_client, run_id):
    feed, _ = _feed(redis_client, run_id)
    episode = _record(run_id, 0)
    ids = _append(redis_client, run_id, episode, episode, _record(run_id, 0), _record(run_id, 1), _record(run_id, 1))
    taken = feed.next_step(after_step=0, policy_version=0)
    assert [entry.entry_id for entry in taken.groups[0]] == [ids[0], ids[2]]
    # The copy a retried XADD made is acknowledged; the trained entries wait for a checkpoint.
    assert _pending(redis_client, run_id) == {ids[0], ids[2], ids[3], ids[4]}

    # A redelivered rollout task produces group 0 again.
    again = _append(redis_client, run_id, _record(run_id, 0), _record(run_id, 0),
                    *(_record(run_id, index) for index in (2, 2, 3, 3)))
    second = feed.next_step(after_step=1, policy_version=0)
    assert second.group_ids == [_group(run_id, 2), _group(run_id, 3)]
    assert not set(again[:2]) & _pending(redis_client, run_id)


def test_stale_groups_are_dropped_whole_before_the_loss_and_recorded_as_dropped(redis_client, run_id):
    feed, _ = _feed(redis_client, run_id, max_staleness=1)
    stale = [_record(run_id, 0, policy_version=3), _record(run_id, 0, policy_version=5)]
    stale_ids = _append(redis_client, run_id, *stale)
    _append(redis_client, run_id, *(_record(run_id, index, policy_version=5) for index in (1, 1, 2, 2)))
    taken = feed.next_step(after_step=7, policy_version=5)
    assert taken.group_ids == [_group(run_id, 1), _group(run_id, 2)]
    assert not set(stale_ids) & _pending(redis_client, run_id)
    assert _consumed(redis_client, run_id, [_group(run_id, 0)]) == [True]
    (dropped,) = _lineage(redis_client, run_id)
    assert (dropped.kind, dropped.step, dropped.policy_version, dropped.group_ids) == (
        "dropped", 7, 5, [_group(run_id, 0)])
    assert dropped.trajectory_ids == [record.trajectory_id for record in stale]
    fields = feed.step_fields(wall_s=1.0)
    assert (fields["stale_groups_dropped"], fields["stale_trajectories_dropped"]) == (1, 2)
    assert [span.outcome for span in fields["episodes"]] == ["dropped_stale"] * 2


def test_groups_never_delivered_are_counted_lost_their_stragglers_refused_and_replacements_requested(
        redis_client, run_id):
    clock = _Clock()
    # Sync: each group is requested only when the step needs it, so the replacement stands out.
    feed, celery = _feed(redis_client, run_id, clock=clock, pipeline="sync", groups_per_step=1, rl_steps_left=1)
    (held,) = _append(redis_client, run_id, _record(run_id, 0))
    late = []

    def between_reads():
        if clock.now == 0.0:
            clock.now = 1e9  # group 0's producer died: past any rollout timeout
        elif not late:
            late.extend(_append(redis_client, run_id, _record(run_id, 0), _record(run_id, 1), _record(run_id, 1)))

    taken = feed.next_step(after_step=2, policy_version=1, between_reads=between_reads)
    assert taken.group_ids == [_group(run_id, 1)]
    assert celery.first_groups() == [0, 1]  # one replacement
    # The episode held for the lost group and its straggler are acknowledged, never trained.
    assert _pending(redis_client, run_id) == {entry.entry_id for entry in taken.groups[0]}
    assert held not in _pending(redis_client, run_id) and late[0] not in _pending(redis_client, run_id)
    (lost,) = _lineage(redis_client, run_id)
    assert (lost.kind, lost.step, lost.group_ids) == ("lost", 2, [_group(run_id, 0)])
    fields = feed.step_fields(wall_s=1.0)
    assert fields["episodes_lost"] == 2
    assert [span.outcome for span in fields["episodes"]] == ["dropped_incomplete"]
    assert feed.step_fields(wall_s=1.0)["episodes_lost"] == 0  # counted in one step event


def test_trained_groups_are_acknowledged_only_once_a_checkpoint_holds_their_update(redis_client, run_id):
    feed, _ = _feed(redis_client, run_id)
    ids = _append(redis_client, run_id, *(_record(run_id, index, policy_version=1) for index in (0, 0, 1, 1)))
    taken = feed.next_step(after_step=3, policy_version=2)
    feed.trained(taken, kept=taken.records, step=4, policy_version=3)
    assert _pending(redis_client, run_id) == set(ids)
    feed.checkpoint_committed(3)  # an older checkpoint does not hold the update
    assert _pending(redis_client, run_id) == set(ids)
    feed.checkpoint_committed(4)
    assert _pending(redis_client, run_id) == set()
    assert _consumed(redis_client, run_id, taken.group_ids) == [True, True]
    (trained,) = _lineage(redis_client, run_id)
    assert (trained.kind, trained.step, trained.policy_version, trained.group_ids) == (
        "trained", 4, 3, taken.group_ids)
    assert trained.trajectory_ids == [record.trajectory_id for record in taken.records]
    fields = feed.step_fields(wall_s=2.0)
    # Staleness is measured against the policy the update started from (2), not the one it published.
    assert fields["staleness_mean"] == fields["staleness_max"] == 1.0
    assert fields["staleness_histogram"] == {"1": 4}
    assert [span.outcome for span in fields["episodes"]] == ["trained"] * 4
    assert fields["samples_produced_per_s"] == 4 / 2.0


def test_a_resumed_trainer_trains_again_what_no_checkpoint_held_and_counts_undelivered_groups_lost(
        redis_client, run_id):
    first, _ = _feed(redis_client, run_id, consumer="trainer-a")
    _append(redis_client, run_id, *(_record(run_id, index) for index in (0, 0, 1, 1, 2, 2)))
    taken = first.next_step(after_step=0, policy_version=0)  # groups 0-3 requested, 0-2 delivered
    first.trained(taken, kept=taken.records, step=1, policy_version=1)
    # ... and the trainer dies before a checkpoint holds step 1.

    resumed, celery = _feed(redis_client, run_id, consumer="trainer-b")
    resumed.resume(step=0, policy_version=1)
    lost = [entry for entry in _lineage(redis_client, run_id) if entry.kind == "lost"]
    assert [(entry.step, entry.group_ids) for entry in lost] == [(0, [_group(run_id, 3)])]
    # Late episodes of theirs are duplicates, to this trainer and to any that resumes the run later.
    assert _consumed(redis_client, run_id, [_group(run_id, i) for i in range(4)]) == [False] * 3 + [True]
    again = resumed.next_step(after_step=0, policy_version=1)
    assert [[entry.entry_id for entry in group] for group in again.groups] == [
        [entry.entry_id for entry in group] for group in taken.groups]
    assert celery.first_groups()[0] == 4  # group ids are never reused
    assert resumed.step_fields(wall_s=1.0)["episodes_lost"] == 1 * 2


def test_groups_the_algorithm_keeps_none_of_are_consumed_at_once_and_replaced(redis_client, run_id):
    feed, celery = _feed(redis_client, run_id, rl_steps_left=1)
    _append(redis_client, run_id, *(_record(run_id, index) for index in (0, 0, 1, 1)))
    taken = feed.next_step(after_step=2, policy_version=0)
    assert celery.first_groups() == [0, 1, 2, 3]  # all the run needs, and a step's worth of headroom
    feed.filtered_out(taken, after_step=2, policy_version=0)
    assert _pending(redis_client, run_id) == set()
    assert _consumed(redis_client, run_id, taken.group_ids) == [True, True]
    (dropped,) = _lineage(redis_client, run_id)
    assert (dropped.kind, dropped.step, dropped.group_ids) == ("dropped", 2, taken.group_ids)
    assert [span.outcome for span in feed.step_fields(wall_s=1.0)["episodes"]] == ["dropped_filtered"] * 4
    sent_while_waiting = []

    def between_reads():
        sent_while_waiting.append(celery.first_groups())
        _append(redis_client, run_id, *(_record(run_id, index) for index in (2, 2, 3, 3)))

    feed.next_step(after_step=2, policy_version=0, between_reads=between_reads)
    assert sent_while_waiting[0] == [0, 1, 2, 3, 4, 5]


def test_at_the_end_of_the_run_surplus_episodes_are_consumed_and_the_stream_trimmed_to_empty(redis_client, run_id):
    feed, _ = _feed(redis_client, run_id)
    _append(redis_client, run_id, *(_record(run_id, index) for index in (0, 0, 1, 1, 2)))
    taken = feed.next_step(after_step=0, policy_version=0)
    feed.trained(taken, kept=taken.records, step=1, policy_version=1)
    feed.checkpoint_committed(1)
    assert _pending(redis_client, run_id) != set()  # group 2's first episode, held
    feed.finish()
    assert _pending(redis_client, run_id) == set()
    assert redis_client.xlen(trajectory_stream(run_id)) == 0
    assert _consumed(redis_client, run_id, [_group(run_id, 2)]) == [True]
    # Every appended trajectory has its decision in the lineage: the surplus one too.
    surplus = _lineage(redis_client, run_id)[-1]
    assert (surplus.kind, surplus.step, surplus.group_ids) == ("dropped", 1, [_group(run_id, 2)])
    decided = {trajectory for entry in _lineage(redis_client, run_id) for trajectory in entry.trajectory_ids}
    assert len(decided) == 5


def test_a_fault_a_producer_reports_fails_the_wait_for_episodes_with_its_reason(redis_client, run_id):
    feed, celery = _feed(redis_client, run_id)
    fault = ProducerFault(kind="weights_not_visible", producer="host-b:41",
                          reason="weights.transport is 'filesystem', but /var/weights/run-1/v0 ... 'host-b'")
    redis_client.set(producer_fault_key(run_id), fault.model_dump_json())
    with pytest.raises(ProducerFaultError, match="host-b:41: weights.transport is 'filesystem'") as failed:
        feed.next_step(after_step=0, policy_version=0)
    assert failed.value.fault == fault
    assert celery.sent  # the fault was found while waiting for the episodes asked for
