"""The trainer's stream reader against a real Redis."""

import time

import pytest

from tandem.contracts import (
    TRAINER_CONSUMER_GROUP,
    EpisodeTimings,
    TrajectoryRecord,
    dead_letter_stream,
    trajectory_stream,
)
from trainer.stream import GroupAssembler, StreamEntry, TrajectoryStreamReader


def _record(run_id: int, group: str, reward: float = 1.0, **overrides) -> TrajectoryRecord:
    now = time.time()
    fields = dict(
        run_id=run_id, group_id=group, group_size=2, environment="calculator", policy_version=3,
        policy_versions=[3], token_ids=[1, 2, 3], behaviour_logprobs=[0.0, -0.5, -0.7], loss_mask=[0, 1, 1],
        reward=reward,
        timings=EpisodeTimings(started_at=now, finished_at=now, generation_s=0.0, environment_s=0.0),
    )
    fields.update(overrides)
    return TrajectoryRecord(**fields)


def _append(redis_client, run_id: int, *records: TrajectoryRecord) -> list[str]:
    return [redis_client.xadd(trajectory_stream(run_id), r.to_stream_fields()).decode() for r in records]


def _pending(redis_client, run_id: int) -> dict[str, tuple[str, int]]:
    """Pending entry id -> (consumer, times delivered)."""
    rows = redis_client.xpending_range(trajectory_stream(run_id), TRAINER_CONSUMER_GROUP, "-", "+", 1000)
    return {r["message_id"].decode(): (r["consumer"].decode(), r["times_delivered"]) for r in rows}


def test_unacknowledged_entries_are_read_again_by_a_restarted_trainer(redis_client, run_id):
    stream = trajectory_stream(run_id)
    first = TrajectoryStreamReader(redis_client, run_id=run_id, consumer="trainer-a")
    for group in ["g1", "g1", "g2"]:
        redis_client.xadd(stream, _record(run_id, group).to_stream_fields())
    entries = first.read(block_ms=100)
    assert [e.record.group_id for e in entries] == ["g1", "g1", "g2"]
    first.ack([e.entry_id for e in entries[:2]])  # trained on g1 only, then "crashed"

    restarted = TrajectoryStreamReader(redis_client, run_id=run_id, consumer="trainer-a")
    again = restarted.read(block_ms=100)
    assert [e.entry_id for e in again] == [entries[2].entry_id]
    restarted.ack([again[0].entry_id])
    assert restarted.read(block_ms=50) == []
    assert redis_client.xpending(stream, TRAINER_CONSUMER_GROUP)["pending"] == 0


def test_own_pending_entries_are_handed_out_once_while_their_group_waits(redis_client, run_id):
    first = TrajectoryStreamReader(redis_client, run_id=run_id, consumer="trainer-a")
    ids = _append(redis_client, run_id, _record(run_id, "g1"), _record(run_id, "g2"), _record(run_id, "g3"))
    assert len(first.read(block_ms=100)) == 3

    restarted = TrajectoryStreamReader(redis_client, run_id=run_id, consumer="trainer-a")
    # Two pages of its own history, then nothing: held entries are not re-read on every read.
    assert [e.entry_id for e in restarted.read(block_ms=10, count=2)] == ids[:2]
    assert [e.entry_id for e in restarted.read(block_ms=10, count=2)] == ids[2:]
    assert restarted.read(block_ms=10) == []
    assert {times for _, times in _pending(redis_client, run_id).values()} == {2}


def test_unreadable_entries_go_to_the_dead_letter_stream_with_a_reason(redis_client, run_id):
    reader = TrajectoryStreamReader(redis_client, run_id=run_id, consumer="trainer-a")
    redis_client.xadd(trajectory_stream(run_id), {"schema_version": "99", "payload": "{}"})
    redis_client.xadd(trajectory_stream(run_id), _record(run_id, "g1").to_stream_fields())
    entries = reader.read(block_ms=100)
    assert [e.record.group_id for e in entries] == ["g1"]
    dead = redis_client.xrange(dead_letter_stream(run_id))
    assert len(dead) == 1 and b"schema_version" in dead[0][1][b"reason"]
    assert redis_client.xpending(trajectory_stream(run_id), TRAINER_CONSUMER_GROUP)["pending"] == 1


def test_groups_are_handed_out_whole_and_trained_once(redis_client, run_id):
    assembler = GroupAssembler()
    assembler.add(StreamEntry("1-0", _record(run_id, "a")))
    assembler.add(StreamEntry("2-0", _record(run_id, "b")))
    assert assembler.complete_groups() == 0
    assembler.add(StreamEntry("3-0", _record(run_id, "b")))
    assert assembler.complete_groups() == 1
    (group,) = assembler.take(4)
    assert [e.entry_id for e in group] == ["2-0", "3-0"]
    # A redelivered task regenerates group b: it is acknowledged, never trained again.
    assembler.add(StreamEntry("4-0", _record(run_id, "b")))
    assert assembler.take(4) == [] and assembler.take_duplicates() == ["4-0"]


def test_a_trajectory_appended_twice_never_completes_its_group(run_id):
    assembler = GroupAssembler()
    record = _record(run_id, "a")
    assembler.add(StreamEntry("1-0", record))
    assembler.add(StreamEntry("2-0", record))  # a producer's XADD retried after a timeout
    assert assembler.complete_groups() == 0
    assert assembler.take_duplicates() == ["2-0"]
    assembler.add(StreamEntry("3-0", _record(run_id, "a")))
    (group,) = assembler.take(1)
    assert [e.entry_id for e in group] == ["1-0", "3-0"]


def test_the_assembler_remembers_a_bounded_number_of_ids(run_id):
    assembler = GroupAssembler(trained_group_ids=["old"], max_remembered_ids=2)
    assembler.add(StreamEntry("1-0", _record(run_id, "old")))
    assert assembler.take_duplicates() == ["1-0"]
    for index in range(3):
        assembler.add(StreamEntry(f"{index + 2}-0", _record(run_id, f"g{index}", group_size=1)))
    assembler.take(3)
    assert len(assembler._trained) == 2 and len(assembler._seen_trajectories) == 2


def test_consumed_groups_are_never_trained_again_even_by_a_restarted_trainer(redis_client, run_id):
    reader = TrajectoryStreamReader(redis_client, run_id=run_id, consumer="trainer-a")
    first, second = _record(run_id, "g1"), _record(run_id, "g1")
    _append(redis_client, run_id, first, second)
    assembler = GroupAssembler()
    for entry in reader.read(block_ms=100):
        assembler.add(entry)
    groups = assembler.take(1)
    assert reader.ack_consumed(groups) == 2

    # A redelivered rollout task regenerates g1 (new trajectory ids), and a
    # producer retries the XADD of one finished trajectory of another group.
    retried = _record(run_id, "g2", trajectory_id=first.trajectory_id)
    _append(redis_client, run_id, _record(run_id, "g1"), _record(run_id, "g1"), retried, _record(run_id, "g3"))
    restarted = TrajectoryStreamReader(redis_client, run_id=run_id, consumer="trainer-b")
    entries = restarted.read(block_ms=100)
    assert [e.record.group_id for e in entries] == ["g3"]
    assert restarted.counters.duplicates_acked == 3
    assert list(_pending(redis_client, run_id)) == [entries[0].entry_id]


def test_the_consumed_ledger_keeps_only_the_newest_ids(redis_client, run_id):
    reader = TrajectoryStreamReader(redis_client, run_id=run_id, consumer="trainer-a", consumed_ids_kept=3)
    _append(redis_client, run_id, *[_record(run_id, f"g{i}", group_size=1) for i in range(5)])
    entries = reader.read(block_ms=100)
    for entry in entries:
        reader.ack_consumed([[entry]])
    from tandem.contracts import consumed_groups_key, consumed_trajectories_key

    assert redis_client.zrange(consumed_groups_key(run_id), 0, -1) == [b"g2", b"g3", b"g4"]
    assert redis_client.zcard(consumed_trajectories_key(run_id)) == 3


def test_entries_of_a_dead_consumer_are_reclaimed_after_the_idle_timeout(redis_client, run_id):
    dead = TrajectoryStreamReader(redis_client, run_id=run_id, consumer="trainer-dead")
    ids = _append(redis_client, run_id, _record(run_id, "g1"), _record(run_id, "g1"))
    assert len(dead.read(block_ms=100)) == 2  # then it dies without acknowledging

    live = TrajectoryStreamReader(redis_client, run_id=run_id, consumer="trainer-live", reclaim_idle_ms=300)
    assert live.read(block_ms=10) == []  # not idle long enough yet
    time.sleep(0.35)
    reclaimed = live.read(block_ms=10)
    assert [e.entry_id for e in reclaimed] == ids
    assert live.counters.reclaimed == 2
    assert {consumer for consumer, _ in _pending(redis_client, run_id).values()} == {"trainer-live"}


def test_held_entries_are_not_reclaimed_while_their_group_waits(redis_client, run_id):
    live = TrajectoryStreamReader(redis_client, run_id=run_id, consumer="trainer-live", reclaim_idle_ms=200)
    (held_id,) = _append(redis_client, run_id, _record(run_id, "g1"))
    assert len(live.read(block_ms=10)) == 1
    for _ in range(4):
        time.sleep(0.1)
        assert live.read(block_ms=10) == []
    # Still one delivery: waiting for a group's last episode never makes it look like poison.
    assert _pending(redis_client, run_id) == {held_id: ("trainer-live", 1)}


def test_an_entry_delivered_too_often_goes_to_the_dead_letter_stream(redis_client, run_id):
    (poison_id,) = _append(redis_client, run_id, _record(run_id, "g1"))
    _append(redis_client, run_id, _record(run_id, "g2"))
    reader = TrajectoryStreamReader(redis_client, run_id=run_id, consumer="trainer-a", max_deliveries=2)
    entries = reader.read(block_ms=100, count=1)
    assert [e.entry_id for e in entries] == [poison_id]
    # The trainer crashes on it, restarts, re-reads it, and crashes again.
    restarted = TrajectoryStreamReader(redis_client, run_id=run_id, consumer="trainer-a", max_deliveries=2)
    assert [e.entry_id for e in restarted.read(block_ms=100, count=1)] == [poison_id]
    again = TrajectoryStreamReader(redis_client, run_id=run_id, consumer="trainer-a", max_deliveries=2)
    assert [e.record.group_id for e in again.read(block_ms=100)] == ["g2"]

    (dead,) = redis_client.xrange(dead_letter_stream(run_id))
    assert dead[1][b"original_id"].decode() == poison_id
    assert dead[1][b"reason"] == b"delivered 3 times (max_deliveries 2)"
    assert poison_id not in _pending(redis_client, run_id)
    assert again.counters.dead_lettered == 1


def test_a_reclaimed_entry_delivered_too_often_goes_to_the_dead_letter_stream(redis_client, run_id):
    (poison_id,) = _append(redis_client, run_id, _record(run_id, "g1"))
    TrajectoryStreamReader(redis_client, run_id=run_id, consumer="c0").read(block_ms=100)
    handed_out = {}
    for consumer in ("c1", "c2"):  # each takes it over, then dies
        time.sleep(0.06)
        reader = TrajectoryStreamReader(redis_client, run_id=run_id, consumer=consumer,
                                        reclaim_idle_ms=50, max_deliveries=2)
        handed_out[consumer] = [e.entry_id for e in reader.read(block_ms=10)]
    assert handed_out == {"c1": [poison_id], "c2": []}  # the third delivery is one too many
    assert redis_client.xlen(dead_letter_stream(run_id)) == 1
    assert _pending(redis_client, run_id) == {}


def test_trimming_keeps_pending_entries_and_removes_acknowledged_ones(redis_client, run_id):
    stream = trajectory_stream(run_id)
    reader = TrajectoryStreamReader(redis_client, run_id=run_id, consumer="trainer-a")
    assert reader.trim() == 0  # nothing read yet: nothing may go
    ids = _append(redis_client, run_id, *[_record(run_id, f"g{i}", group_size=1) for i in range(5)])
    entries = reader.read(block_ms=100)
    reader.ack([ids[0], ids[1], ids[3]])  # ids[2] and ids[4] are still being trained on

    assert reader.trim() == 2
    remaining = [raw_id.decode() for raw_id, _ in redis_client.xrange(stream)]
    assert remaining == ids[2:]  # the acknowledged ids[3] waits behind the pending ids[2]

    undelivered = _append(redis_client, run_id, _record(run_id, "late", group_size=1))
    reader.ack_consumed([[e] for e in entries if e.entry_id in (ids[2], ids[4])])
    assert reader.trim() == 3
    assert [raw_id.decode() for raw_id, _ in redis_client.xrange(stream)] == undelivered
    assert [e.entry_id for e in reader.read(block_ms=100)] == undelivered


def test_trimming_waits_for_every_consumer_group(redis_client, run_id):
    stream = trajectory_stream(run_id)
    reader = TrajectoryStreamReader(redis_client, run_id=run_id, consumer="trainer-a")
    ids = _append(redis_client, run_id, *[_record(run_id, f"g{i}", group_size=1) for i in range(3)])
    redis_client.xgroup_create(stream, "audit", id=ids[0])  # has read ids[0] only
    reader.ack([e.entry_id for e in reader.read(block_ms=100)])
    assert reader.trim() == 1
    assert [raw_id.decode() for raw_id, _ in redis_client.xrange(stream)] == ids[1:]


@pytest.mark.parametrize("bad", [{"reclaim_idle_ms": 0}, {"max_deliveries": 0}])
def test_reader_settings_must_be_positive(redis_client, run_id, bad):
    with pytest.raises(ValueError):
        TrajectoryStreamReader(redis_client, run_id=run_id, consumer="trainer-a", **bad)


def test_a_resuming_trainer_takes_over_a_dead_trainers_pending_entries_at_once(redis_client, run_id):
    dead = TrajectoryStreamReader(redis_client, run_id=run_id, consumer="dead-trainer", reclaim_idle_ms=600_000)
    ids = _append(redis_client, run_id, *[_record(run_id, f"{run_id}-{i // 2}") for i in range(6)])
    held = dead.read(block_ms=100)
    assert len(held) == 6
    dead.ack_consumed([held[0:2]])  # group 0 trained and acknowledged before the crash
    undelivered = _append(redis_client, run_id, _record(run_id, f"{run_id}-3"))

    resumed = TrajectoryStreamReader(redis_client, run_id=run_id, consumer="new-trainer", reclaim_idle_ms=600_000)
    assert resumed.take_over_pending() == 4

    assert set(_pending(redis_client, run_id)) == set(ids[2:])
    assert {consumer for consumer, _ in _pending(redis_client, run_id).values()} == {"new-trainer"}
    consumers = {c["name"].decode() for c in redis_client.xinfo_consumers(trajectory_stream(run_id),
                                                                          TRAINER_CONSUMER_GROUP)}
    assert consumers == {"new-trainer"}
    # Without waiting reclaim_idle_ms: the claimed entries first, then the undelivered one.
    read = resumed.read(block_ms=100)
    read += resumed.read(block_ms=100)
    assert [e.entry_id for e in read] == ids[2:] + undelivered
    assert resumed.group_ids_in_stream() == {f"{run_id}-{i}" for i in range(4)}
    assert resumed.consumed_group_ids([f"{run_id}-{i}" for i in range(5)]) == {f"{run_id}-0"}
    resumed.record_consumed_groups([f"{run_id}-4"])
    assert resumed.consumed_group_ids([f"{run_id}-4"]) == {f"{run_id}-4"}


def test_a_consumer_group_redis_lost_is_recreated_after_the_newest_entry_trained_on(redis_client, run_id):
    """Before, a Redis restarted without its data left every read failing with NOGROUP, for good."""
    stream = trajectory_stream(run_id)
    reader = TrajectoryStreamReader(redis_client, run_id=run_id, consumer="trainer-a")
    trained = _append(redis_client, run_id, _record(run_id, "g1"), _record(run_id, "g1"))
    assert [entry.entry_id for entry in reader.read(block_ms=100)] == trained
    reader.restart_position = trained[-1]  # as the feed sets it once the step is trained
    fresh = _append(redis_client, run_id, _record(run_id, "g2"))

    redis_client.xgroup_destroy(stream, TRAINER_CONSUMER_GROUP)  # what a Redis without its data has

    assert [entry.entry_id for entry in reader.read(block_ms=100)] == fresh
    assert reader.counters.groups_recreated == 1
    assert redis_client.xinfo_groups(stream)[0]["name"].decode() == TRAINER_CONSUMER_GROUP
