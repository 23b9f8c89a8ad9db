"""Held-out evaluation on the trainer's side: the estimators by hand, and asking and gathering on a real Redis."""

from __future__ import annotations

import json
import math
import time

import pytest

from tandem.configs.evaluation import EvaluationConfig
from tandem.contracts import (
    EVALUATION_METRICS,
    EVALUATION_QUEUE,
    EVALUATION_TASK_NAME,
    ConversationMessage,
    EpisodeTimings,
    EvaluationEpisode,
    EvaluationProgress,
    EvaluationRequest,
    EvaluationSliceFailure,
    MessageToolCall,
    TrajectoryRecord,
    evaluation_progress_key,
    evaluation_stream,
    evaluation_weights_key,
)
from trainer.evaluation import (
    Evaluations,
    evaluation_metrics,
    evaluation_points,
    pass_at_k,
    wilson_interval,
)


def test_pass_at_k_is_the_unbiased_estimator_computed_by_hand():
    # 5 samples, 2 correct: pass@1 = 2/5; pass@2 = 1 - C(3,2)/C(5,2) = 1 - 3/10; pass@4 = 1 - 0 (only 3 wrong).
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)
    assert pass_at_k(5, 2, 4) == 1.0
    assert pass_at_k(5, 0, 5) == 0.0 and pass_at_k(5, 5, 1) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(3, 1, 4)


def _record(run_id: int, *, reward: float, status: str = "ok", turns: int = 1, calls: int = 0) -> TrajectoryRecord:
    now = time.time()
    messages = [ConversationMessage(role="user", content="1+1=?", start=0, end=1)]
    messages += [ConversationMessage(role="assistant", content="calc(1+1)", start=1, end=2,
                                     tool_calls=(MessageToolCall(name="calc", arguments={"expression": "1+1"}),))
                 for _ in range(calls)]
    return TrajectoryRecord(
        run_id=run_id, group_id=f"{run_id}-evaluation0-0", group_size=4, environment="calculator",
        policy_version=3, policy_versions=[3], token_ids=[1, 2], behaviour_logprobs=[0.0, -0.1], loss_mask=[0, 1],
        reward=reward, status=status, num_turns=turns, messages=tuple(messages),
        timings=EpisodeTimings(started_at=now, finished_at=now, generation_s=0.0, environment_s=0.0),
    )


def _episode(run_id, task, sample, *, evaluation=0, version=3, environment="", **record) -> EvaluationEpisode:
    return EvaluationEpisode(evaluation=evaluation, policy_version=version, task_index=task, sample_index=sample,
                             environment=environment, record=_record(run_id, **record))


def test_an_evaluations_metrics_match_a_hand_computation(run_id):
    # Task 0: 4 samples, 1 success (reward 1); task 1: 4 samples, 3 successes; one of task 1's
    # failures failed outright, one of task 0's was truncated; task 0's success made 2 tool calls.
    episodes = [
        _episode(run_id, 0, 0, reward=1.0, turns=3, calls=2), _episode(run_id, 0, 1, reward=0.0, status="truncated"),
        _episode(run_id, 0, 2, reward=0.0), _episode(run_id, 0, 3, reward=0.0),
        _episode(run_id, 1, 0, reward=1.0), _episode(run_id, 1, 1, reward=0.5), _episode(run_id, 1, 2, reward=1.0),
        _episode(run_id, 1, 3, reward=0.0, status="failed"),
    ]
    metrics, intervals = evaluation_metrics(episodes, pass_k=[1, 2])
    assert set(EVALUATION_METRICS) <= set(metrics)
    assert metrics["mean_reward"] == pytest.approx(3.5 / 8)
    assert metrics["success_rate"] == pytest.approx(4 / 8)
    assert metrics["mean_turns"] == pytest.approx(10 / 8)
    assert metrics["tool_calls_per_episode"] == pytest.approx(2 / 8)
    assert metrics["truncation_rate"] == metrics["failure_rate"] == pytest.approx(1 / 8)
    # pass@1 = mean(1/4, 3/4); pass@2 = mean(1 - C(3,2)/C(4,2), 1 - C(1,2)/C(4,2)) = mean(1/2, 1).
    assert metrics["pass@1"] == pytest.approx(0.5)
    assert metrics["pass@2"] == pytest.approx(0.75)
    assert metrics["avg@1"] == metrics["avg@2"] == pytest.approx(0.5)
    assert intervals["success_rate"] == pytest.approx(wilson_interval(4, 8))
    low, high = intervals["pass@2"]
    half = 1.96 * math.sqrt(((0.5 - 0.75) ** 2 + (1 - 0.75) ** 2) / 1) / math.sqrt(2)
    assert (low, high) == pytest.approx((max(0.0, 0.75 - half), min(1.0, 0.75 + half)))


def test_a_mean_reward_interval_never_reaches_past_the_rewards_range(run_id):
    # 7 of 8 episodes at 1: mean 0.875, whose normal interval [0.63, 1.12] would claim a mean above any reward.
    episodes = [_episode(run_id, task, 0, reward=1.0 if task else 0.0) for task in range(8)]
    metrics, intervals = evaluation_metrics(episodes, pass_k=[1])
    half = 1.96 * math.sqrt(0.125) / math.sqrt(8)
    assert metrics["mean_reward"] == pytest.approx(0.875)
    assert intervals["mean_reward"] == pytest.approx((0.875 - half, 1.0))


def test_an_evaluation_of_an_environment_with_tools_reports_their_use_with_intervals(run_id):
    def with_turns(episode, *outcomes):
        messages = [ConversationMessage(
            role="assistant", content="...", start=0, end=1, tool_call_status=outcome,
            tool_calls=(MessageToolCall(name="calc", copies_example=episode.record.reward == 0),)
            if outcome == "ok" else ())
            for outcome in outcomes]
        record = episode.record.model_copy(update={"messages": tuple(messages), "offered_tools": ("calc",)})
        return episode.model_copy(update={"record": record})

    episodes = [with_turns(_episode(run_id, 0, 0, reward=1.0), "unparsed", "ok", None),
                with_turns(_episode(run_id, 0, 1, reward=1.0), "ok", None),
                with_turns(_episode(run_id, 0, 2, reward=0.0), "ok", None),  # the tool's example, copied
                with_turns(_episode(run_id, 0, 3, reward=0.0), "unknown_tool", None)]
    metrics, intervals = evaluation_metrics(episodes, pass_k=[1])
    assert metrics["tool_call_rate"] == 0.75 and metrics["tool_calls_per_episode"] == 0.75
    assert metrics["answered_no_tools_rate"] == 0.25
    # Five turns wrote markup: one did not parse, one named an unknown tool.
    assert metrics["tool_parse_failure_rate"] == metrics["unknown_tool_rate"] == 0.2
    assert metrics["invalid_arguments_rate"] == 0.0
    assert intervals["tool_call_rate"] == pytest.approx(wilson_interval(3, 4))
    assert intervals["tool_parse_failure_rate"] == pytest.approx(wilson_interval(1, 5))
    # One of the three calls that ran copied its tool's example: its interval is over the calls.
    assert metrics["example_copy_rate"] == pytest.approx(1 / 3)
    assert intervals["example_copy_rate"] == pytest.approx(wilson_interval(1, 3))
    # An environment without tools reports none of them.
    plain, _ = evaluation_metrics([_episode(run_id, 0, 0, reward=1.0)], pass_k=[1])
    assert "tool_call_rate" not in plain


def test_evaluations_happen_before_rl_every_so_many_steps_and_at_the_end():
    assert evaluation_points(25, 10) == [0, 10, 20, 25]
    assert evaluation_points(20, 10) == [0, 10, 20]
    assert evaluation_points(3, 10) == [0, 3]


class _RecordingCelery:
    def __init__(self):
        self.sent = []

    def send_task(self, name, *, kwargs, queue):
        self.sent.append((name, kwargs, queue))


def _evaluations(redis_client, run_id, other_environments=(), **config):
    celery, kept = _RecordingCelery(), []

    def publish_kept(version, key):
        kept.append((version, key))
        redis_client.hset(key, "version", version)

    evaluations = Evaluations(redis_client=redis_client, celery_app=celery, run_id=run_id,
                              config=EvaluationConfig(**config), environment="calculator@1",
                              publish_kept=publish_kept, other_environments=other_environments)
    return evaluations, celery, kept


def test_an_evaluation_is_asked_for_in_slices_and_reported_once_its_episodes_are_in(redis_client, run_id):
    evaluations, celery, kept = _evaluations(redis_client, run_id, tasks=5, samples_per_task=2,
                                             tasks_per_request=2, every_steps=10, pass_k=[1, 2])
    evaluations.request(index=1, step=310, policy_version=11)
    assert kept == [(11, evaluation_weights_key(run_id, 11))]
    assert redis_client.ttl(evaluation_weights_key(run_id, 11)) > 0
    requests = [EvaluationRequest.model_validate_json(kwargs["request"]) for name, kwargs, queue in celery.sent
                if name == EVALUATION_TASK_NAME and queue == EVALUATION_QUEUE]
    assert [(r.first_task, r.tasks) for r in requests] == [(0, 2), (2, 2), (4, 1)]
    assert {(r.evaluation, r.policy_version, r.samples_per_task, r.temperature) for r in requests} == {(1, 11, 2, 0.0)}

    stream = evaluation_stream(run_id)
    # Another trainer's evaluation of the run, and a copy of one episode: neither counts.
    redis_client.xadd(stream, _episode(run_id, 0, 0, evaluation=1, version=4, reward=1.0).to_stream_fields())
    arrived = [_episode(run_id, task, sample, evaluation=1, version=11, reward=float(task % 2))
               for task in range(5) for sample in range(2)]
    for episode in arrived[:-1] + arrived[:1]:
        redis_client.xadd(stream, episode.to_stream_fields())
    assert evaluations.collect() == []
    redis_client.xadd(stream, arrived[-1].to_stream_fields())
    (finished,) = evaluations.collect()
    report = finished.report
    assert sorted(record.trajectory_id for record in finished.records) == sorted(report.trajectory_ids)
    assert (report.evaluation, report.step, report.policy_version, report.status) == (1, 310, 11, "complete")
    assert report.episodes == 10 and report.environment == "calculator@1"
    assert report.metrics["success_rate"] == pytest.approx(4 / 10) and report.metrics["pass@2"] == pytest.approx(0.4)
    assert sorted(report.trajectory_ids) == sorted(episode.record.trajectory_id for episode in arrived)
    assert evaluations.collect() == [] and evaluations.outstanding == 0
    # Its episodes and kept version are gone; the earlier trainer's episode is left alone.
    assert redis_client.xlen(stream) == 1 and not redis_client.exists(evaluation_weights_key(run_id, 11))
    assert json.loads(report.model_dump_json())["intervals"]["success_rate"]


def test_the_end_of_the_run_reports_what_has_not_come_back_as_incomplete(redis_client, run_id):
    evaluations, _, _ = _evaluations(redis_client, run_id, tasks=2, samples_per_task=2, every_steps=10)
    evaluations.request(index=2, step=320, policy_version=21)
    redis_client.xadd(evaluation_stream(run_id), _episode(run_id, 0, 0, evaluation=2, version=21,
                                                          reward=1.0).to_stream_fields())
    beats = []
    (finished,) = evaluations.finish(timeout_s=1.5, between=lambda: beats.append(1))
    report = finished.report
    assert report.status == "incomplete" and report.episodes == 1
    assert "1 of 4 episodes" in report.reason and report.metrics["success_rate"] == 1.0
    assert beats  # the trainer's heartbeat ran while it waited


def test_a_slice_given_up_on_reports_its_evaluation_at_once_as_incomplete_with_why(redis_client, run_id):
    evaluations, _, _ = _evaluations(redis_client, run_id, tasks=4, samples_per_task=2, tasks_per_request=2,
                                     every_steps=10)
    evaluations.request(index=1, step=310, policy_version=11)
    stream = evaluation_stream(run_id)
    for task, sample in [(0, 0), (0, 1), (1, 0)]:
        redis_client.xadd(stream, _episode(run_id, task, sample, evaluation=1, version=11,
                                           reward=1.0).to_stream_fields())
    # Tasks 2..3 never ran: their producer gave up (an earlier trainer's failure does not count).
    redis_client.xadd(stream, EvaluationSliceFailure(evaluation=1, policy_version=4, first_task=0, tasks=2,
                                                     reason="not this one").to_stream_fields())
    redis_client.xadd(stream, EvaluationSliceFailure(evaluation=1, policy_version=11, first_task=2, tasks=2,
                                                     reason="EvaluationSliceError: no such tool").to_stream_fields())
    assert evaluations.collect() == []  # task 1 sample 1 may still come
    progress = EvaluationProgress.model_validate_json(redis_client.hget(evaluation_progress_key(run_id), "1"))
    assert (progress.episodes_expected, progress.episodes_received, progress.status) == (8, 3, "running")

    redis_client.xadd(stream, _episode(run_id, 1, 1, evaluation=1, version=11, reward=0.0).to_stream_fields())
    (finished,) = evaluations.collect()
    report = finished.report
    assert (report.status, report.episodes) == ("incomplete", 4)
    assert report.reason.startswith("4 of 8 episodes were given up on by producers")
    assert "tasks 2..3: EvaluationSliceError: no such tool" in report.reason and "not this one" not in report.reason
    assert report.metrics["success_rate"] == pytest.approx(3 / 4)
    progress = EvaluationProgress.model_validate_json(redis_client.hget(evaluation_progress_key(run_id), "1"))
    assert (progress.episodes_received, progress.status) == (4, "incomplete")
    assert evaluations.outstanding == 0


def test_an_evaluations_progress_is_kept_for_progress_bars_until_its_report(redis_client, run_id):
    evaluations, _, _ = _evaluations(redis_client, run_id, tasks=1, samples_per_task=2, every_steps=10)
    evaluations.request(index=0, step=300, policy_version=1)
    progress = EvaluationProgress.model_validate_json(redis_client.hget(evaluation_progress_key(run_id), "0"))
    assert (progress.policy_version, progress.episodes_expected, progress.episodes_received) == (1, 2, 0)
    for sample in range(2):
        redis_client.xadd(evaluation_stream(run_id), _episode(run_id, 0, sample, evaluation=0, version=1,
                                                              reward=1.0).to_stream_fields())
    (finished,) = evaluations.collect()
    progress = EvaluationProgress.model_validate_json(redis_client.hget(evaluation_progress_key(run_id), "0"))
    assert (progress.episodes_received, progress.status) == (2, "complete") == (2, finished.report.status)


def test_each_point_evaluates_every_environment_apart_and_keeps_its_version_until_the_last_is_in(
        redis_client, run_id):
    evaluations, celery, _ = _evaluations(redis_client, run_id, other_environments=["guess@2"], tasks=2,
                                          samples_per_task=1, every_steps=10)
    evaluations.request(index=1, step=310, policy_version=11)
    requests = [EvaluationRequest.model_validate_json(kwargs["request"]) for _, kwargs, _ in celery.sent]
    assert sorted((r.environment, r.first_task, r.tasks) for r in requests) == [("", 0, 2), ("guess@2", 0, 2)]
    stream = evaluation_stream(run_id)
    for task in range(2):
        redis_client.xadd(stream, _episode(run_id, task, 0, evaluation=1, version=11, environment="guess@2",
                                           reward=0.0).to_stream_fields())
    (guess,) = evaluations.collect()
    assert (guess.report.environment, guess.report.episodes, guess.report.metrics["success_rate"]) == ("guess@2", 2, 0)
    # The run's own environment's evaluation of the version is still out: its kept copy stays.
    assert redis_client.exists(evaluation_weights_key(run_id, 11))
    progress = EvaluationProgress.model_validate_json(redis_client.hget(evaluation_progress_key(run_id), "1"))
    assert (progress.episodes_expected, progress.episodes_received, progress.status) == (4, 2, "running")

    for task in range(2):
        redis_client.xadd(stream, _episode(run_id, task, 0, evaluation=1, version=11, reward=1.0).to_stream_fields())
    (own,) = evaluations.collect()
    assert (own.report.environment, own.report.metrics["success_rate"]) == ("calculator@1", 1.0)
    assert not set(own.report.trajectory_ids) & set(guess.report.trajectory_ids)
    assert not redis_client.exists(evaluation_weights_key(run_id, 11))
    progress = EvaluationProgress.model_validate_json(redis_client.hget(evaluation_progress_key(run_id), "1"))
    assert (progress.episodes_received, progress.status) == (4, "complete")
