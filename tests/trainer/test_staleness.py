"""Bounded staleness at consumption and the staleness records of a step."""

import time

from tandem.contracts import EpisodeTimings, TrainerStepEvent, TrajectoryRecord
from trainer.staleness import (
    StalenessRecorder,
    in_flight_versions,
    in_queue_versions,
    is_stale_group,
    scalar_metrics,
    split_stale_groups,
)
from trainer.stream import GroupAssembler, StreamEntry, TrajectoryStreamReader


def _record(run_id, group, versions, *, finished_at=None):
    finished_at = time.time() if finished_at is None else finished_at
    return TrajectoryRecord(
        run_id=run_id, group_id=group, group_size=2, environment="calculator", policy_version=min(versions),
        policy_versions=versions, token_ids=[1, 2], behaviour_logprobs=[0.0, -0.5], loss_mask=[0, 1],
        reward=1.0,
        timings=EpisodeTimings(started_at=finished_at - 1, finished_at=finished_at, generation_s=0.5,
                               environment_s=0.1),
    )


def _group(run_id, name, *versions):
    return [StreamEntry(f"{i + 1}-0", _record(run_id, name, v)) for i, v in enumerate(versions)]


def test_staleness_splits_into_in_flight_and_in_queue_versions(run_id):
    record = _record(run_id, "g", [3, 4, 6])
    assert in_flight_versions(record) == 3  # weights changed three times during generation
    assert in_queue_versions(record, policy_version=8) == 2  # two more while it waited
    assert in_flight_versions(_record(run_id, "g", [5])) == 0


def test_a_group_with_one_stale_episode_is_dropped_whole(run_id):
    fresh = _group(run_id, "fresh", [9], [8, 10])
    mixed = _group(run_id, "mixed", [10], [7, 10])  # one episode began 3 versions back
    kept, dropped = split_stale_groups([fresh, mixed], policy_version=10, max_staleness=2)
    assert kept == [fresh] and dropped == [mixed]
    assert split_stale_groups([mixed], policy_version=10, max_staleness=None) == ([mixed], [])
    assert is_stale_group(fresh, policy_version=11, max_staleness=2)


def test_stale_trajectories_are_dropped_before_the_loss_and_never_read_again(redis_client, run_id):
    reader = TrajectoryStreamReader(redis_client, run_id=run_id, consumer="trainer-a")
    records = [_record(run_id, "old", [1]), _record(run_id, "old", [2]),
               _record(run_id, "new", [5]), _record(run_id, "new", [5])]
    for record in records:
        redis_client.xadd(reader.stream, record.to_stream_fields())
    assembler = GroupAssembler()
    for entry in reader.read(block_ms=100):
        assembler.add(entry)
    recorder = StalenessRecorder()
    kept, stale = split_stale_groups(assembler.take(2), policy_version=5, max_staleness=3)
    reader.ack_consumed(stale)
    recorder.dropped(stale)
    assert [g[0].record.group_id for g in kept] == ["new"]
    assert redis_client.xpending(reader.stream, "trainer")["pending"] == 2

    # A regenerated copy of the stale group is acknowledged on arrival, not trained.
    redis_client.xadd(reader.stream, _record(run_id, "old", [5]).to_stream_fields())
    assert reader.read(block_ms=100) == [] and reader.counters.duplicates_acked == 1
    recorder.trained([e.record for g in kept for e in g], policy_version=5)
    fields = recorder.step_fields()
    assert fields["stale_trajectories_dropped"] == 2 and fields["stale_groups_dropped"] == 1
    assert fields["stale_drop_rate"] == 0.5


def test_the_assembler_hands_out_the_groups_of_the_oldest_policy_first(run_id):
    """A group that finished late but began early is the nearest to the bound: it goes first."""
    assembler = GroupAssembler()
    arrivals = [("newer", [6]), ("older", [4]), ("newer", [6]), ("newest", [7]), ("newest", [7]),
                ("older", [5, 6])]
    for index, (group, versions) in enumerate(arrivals):
        assembler.add(StreamEntry(f"{index + 1}-0", _record(run_id, group, versions)))
    first, second = assembler.take(1), assembler.take(1)
    assert [[entry.record.group_id for entry in group] for group in first + second] == [
        ["older", "older"], ["newer", "newer"]]
    # Among groups of the same policy, the one that arrived first.
    for index, group in enumerate(["b", "a", "b", "a"]):
        assembler.add(StreamEntry(f"{index + 10}-0", _record(run_id, group, [7])))
    assert [group[0].record.group_id for group in assembler.take(3)] == ["newest", "b", "a"]


def test_stale_partial_groups_can_be_released_from_the_assembler(run_id):
    assembler = GroupAssembler()
    assembler.add(StreamEntry("1-0", _record(run_id, "old", [1])))
    assembler.add(StreamEntry("2-0", _record(run_id, "new", [9])))
    (released,) = assembler.take_partial(
        lambda entries: is_stale_group(entries, policy_version=9, max_staleness=2))
    assert [e.entry_id for e in released] == ["1-0"]
    assembler.add(StreamEntry("3-0", _record(run_id, "old", [1])))  # its late episode
    assert assembler.take_duplicates() == ["3-0"]


def test_step_fields_are_histograms_by_hand_and_fit_the_step_event(run_id):
    now = 1000.0
    recorder = StalenessRecorder()
    recorder.trained([
        _record(run_id, "a", [7], finished_at=now - 1.0),         # total 1, queue 1, flight 0
        _record(run_id, "a", [5, 6, 8], finished_at=now - 3.0),  # total 3, queue 0, flight 3
        _record(run_id, "b", [8], finished_at=now - 2.0),         # total 0, queue 0, flight 0
        _record(run_id, "b", [-100], finished_at=now),            # beyond the last bucket
        _record(run_id, "c", [-70], finished_at=now),             # and so is this one
    ], policy_version=8, consumed_at=now)
    recorder.dropped([_group(run_id, "c", [1], [1])])
    fields = recorder.step_fields()
    assert fields == {
        "staleness_histogram": {"0": 1, "1": 1, "3": 1, "64+": 2},
        "staleness_in_queue_histogram": {"0": 2, "1": 1, "64+": 2},
        "staleness_in_flight_histogram": {"0": 4, "3": 1},
        "queue_wait_s_mean": 1.2,
        "queue_wait_s_max": 3.0,
        "stale_trajectories_dropped": 2,
        "stale_groups_dropped": 1,
        "stale_drop_rate": 2 / 7,
    }
    event = TrainerStepEvent(run_id=run_id, step=1, phase="rl", policy_version=8, wall_s=1.0, wait_s=0.0,
                             compute_s=1.0, publish_s=0.0, other_s=0.0, loss=0.0, emitted_at=now, **fields)
    assert TrainerStepEvent.model_validate_json(event.model_dump_json()) == event
    metrics = scalar_metrics(fields)
    assert metrics["staleness/total/64+"] == 2.0 and metrics["staleness/in_flight/3"] == 1.0
    assert metrics["staleness/in_queue/1"] == 1.0 and metrics["staleness/stale_drop_rate"] == 2 / 7
    assert recorder.step_fields()["stale_drop_rate"] is None  # it started over
