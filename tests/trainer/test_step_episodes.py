"""The episodes a step event carries for the timeline: every one consumed, and what became of it."""

from __future__ import annotations

import json
import time

from tandem.configs.algorithm import AlgorithmConfig
from tandem.contracts import (
    EPISODE_SPAN_REASON_CHARS,
    EpisodeTimings,
    TrainerStepEvent,
    TrajectoryRecord,
)
from trainer.algorithms import build_algorithm
from trainer.step_episodes import StepEpisodes


def _record(group: str, reward: float, *, status="ok", versions=(3,), reason="") -> TrajectoryRecord:
    return TrajectoryRecord(
        run_id=7, group_id=group, group_size=2, environment="calculator", policy_version=min(versions),
        policy_versions=list(versions), token_ids=[1, 2, 3], behaviour_logprobs=[0.0, -0.5, -0.2],
        loss_mask=[0, 1, 1], reward=reward, status=status, failure_reason=reason,
        timings=EpisodeTimings(started_at=100.0, finished_at=102.5, generation_s=1.5, environment_s=0.5,
                               tool_s=0.25),
    )


def test_every_consumed_episode_is_reported_with_what_became_of_it():
    # Dynamic sampling (DAPO's) drops the group without reward variance.
    algorithm = build_algorithm(AlgorithmConfig(name="grpo", dynamic_sampling=True))
    learned = [_record("learned", 1.0, versions=(3, 4)), _record("learned", 0.0)]
    flat = [_record("flat", 1.0), _record("flat", 1.0)]
    broken = [_record("broken", 1.0), _record("broken", 0.0, status="failed", reason="boom\x00" + "x" * 500)]
    stale = [_record("stale", 1.0, versions=(0,)), _record("stale", 0.0, versions=(0,))]
    episodes = StepEpisodes()

    episodes.dropped(stale, outcome="dropped_stale")
    groups = [learned, flat, broken]
    prepared = algorithm.prepare(groups)
    episodes.consumed([record for group in groups for record in group], trained=prepared.records)
    spans = episodes.take()

    outcomes = {(span.group_id, span.status): [] for span in spans}
    for span in spans:
        outcomes[(span.group_id, span.status)].append(span.outcome)
    assert outcomes == {
        ("stale", "ok"): ["dropped_stale", "dropped_stale"],
        ("learned", "ok"): ["trained", "trained"],
        ("flat", "ok"): ["dropped_filtered", "dropped_filtered"],
        # Its sibling failed, so it has no variance of its own: filtered too.
        ("broken", "ok"): ["dropped_filtered"],
        ("broken", "failed"): ["failed"],
    }
    first = spans[2]
    assert (first.trajectory_id, first.environment) == (learned[0].trajectory_id, "calculator")
    assert (first.started_at, first.finished_at) == (100.0, 102.5)
    assert (first.generation_s, first.environment_s, first.tool_s) == (1.5, 0.5, 0.25)
    assert (first.policy_version, first.newest_policy_version, first.reward) == (3, 4, 1.0)
    failed = next(span for span in spans if span.status == "failed")
    assert failed.failure_reason.startswith("boom") and "\x00" not in failed.failure_reason
    assert len(failed.failure_reason) == EPISODE_SPAN_REASON_CHARS  # NULs go before the cut
    # Taken once: the next step starts empty.
    assert len(episodes) == 0 and episodes.take() == []


def test_the_episodes_travel_in_the_step_event_and_old_events_still_parse():
    episodes = StepEpisodes()
    episodes.consumed([_record("g", 1.0), _record("g", 0.0)], trained=[])
    event = TrainerStepEvent(run_id=7, step=3, phase="rl", policy_version=3, wall_s=1.0, wait_s=0.5,
                             compute_s=0.3, publish_s=0.1, other_s=0.1, loss=0.5,
                             episodes=episodes.take(), emitted_at=time.time())

    again = TrainerStepEvent.model_validate(json.loads(event.model_dump_json()))

    assert again == event and len(again.episodes) == 2
    # Episodes are the timeline's, not series: no metric value comes of them.
    older = json.loads(event.model_dump_json())
    del older["episodes"]
    older = TrainerStepEvent.model_validate(older)
    assert older.episodes == []
    assert older.metric_values() == event.metric_values()


def test_a_thousand_episodes_each_get_the_outcome_of_their_own_record():
    # Spans are built by trajectory, not by position: each keeps its own record's fate
    # even when the trained half interleaves with the filtered half.
    records = [_record(f"g{i // 8}", float(i % 2)) for i in range(1024)]
    trained = records[::2]
    episodes = StepEpisodes()
    episodes.consumed(records, trained=trained)
    spans = episodes.take()
    assert [span.trajectory_id for span in spans] == [record.trajectory_id for record in records]
    trained_ids = {record.trajectory_id for record in trained}
    assert [span.outcome for span in spans] == [
        "trained" if record.trajectory_id in trained_ids else "dropped_filtered" for record in records]
