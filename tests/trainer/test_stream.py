"""The trainer's stream reader against a real Redis."""

import time

from tandem.contracts import (
    TRAINER_CONSUMER_GROUP,
    EpisodeTimings,
    TrajectoryRecord,
    dead_letter_stream,
    trajectory_stream,
)
from trainer.stream import GroupAssembler, TrajectoryStreamReader


def _record(run_id: int, group: str, reward: float = 1.0) -> TrajectoryRecord:
    now = time.time()
    return TrajectoryRecord(
        run_id=run_id, group_id=group, group_size=2, environment="calculator", policy_version=3,
        policy_versions=[3], token_ids=[1, 2, 3], behaviour_logprobs=[0.0, -0.5, -0.7], loss_mask=[0, 1, 1],
        reward=reward,
        timings=EpisodeTimings(started_at=now, finished_at=now, generation_s=0.0, environment_s=0.0),
    )


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
    from trainer.stream import StreamEntry

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
