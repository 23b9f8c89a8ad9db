"""Evaluation episodes on a real Redis and a real JAX engine: the kept version only, held-out tasks, greedy."""

from __future__ import annotations

import asyncio

import pytest
from flax import nnx

from environments.builtin.calculator import CalculatorEnvironment
from policy import Completion
from policy.model import Transformer, TransformerConfig, split_model
from policy.tokenizer import VOCAB_SIZE
from policy.weights import RedisWeightPublisher
from tandem.configs.rollout import RolloutConfig, SamplingConfig
from tandem.configs.run import ModelConfig, RunConfig
from tandem.contracts import (
    EnvironmentSpec,
    EvaluationEpisode,
    EvaluationRequest,
    EvaluationSliceFailure,
    RunSpec,
    environment_paused_key,
    evaluation_stream,
    evaluation_stream_record,
    evaluation_weights_key,
    run_environment_secrets_key,
    run_spec_key,
    trajectory_stream,
)
from tests.workers.secret_environments import API_KEY
from tests.workers.test_security_secret_settings import _keyed_spec, _publish_run
from workers.evaluation import EvaluationSliceError, SharedGreedyTurns, produce_evaluation
from workers.producer import EnvironmentPausedError
from workers.tasks import produce_evaluation_episodes

CONFIG = RunConfig(
    model=ModelConfig(d_model=32, num_layers=1, num_heads=2, mlp_dim=64, max_seq_len=128),
    rollout=RolloutConfig(group_size=3, max_turns=2),
    sampling=SamplingConfig(max_new_tokens=8),
)


def _params(seed: int):
    return split_model(Transformer(TransformerConfig.from_model_config(CONFIG.model, VOCAB_SIZE),
                                   rngs=nnx.Rngs(seed)))[1]


def _set_up(redis_client, run_id: int) -> None:
    # The live policy has moved on to version 9; version 4 is kept for its evaluation.
    RedisWeightPublisher(redis_client).publish(run_id=run_id, version=9, params=_params(0))
    RedisWeightPublisher(redis_client, key_of=lambda _: evaluation_weights_key(run_id, 4)).publish(
        run_id=run_id, version=4, params=_params(1))
    spec = RunSpec(run_id=run_id, config=CONFIG, environment=EnvironmentSpec(
        name="calculator", kind="python", entrypoint="environments.builtin.calculator:CalculatorEnvironment"))
    redis_client.set(run_spec_key(run_id), spec.model_dump_json())


def _episodes(redis_client, run_id) -> list[EvaluationEpisode]:
    return [EvaluationEpisode.from_stream_fields(fields)
            for _, fields in redis_client.xrange(evaluation_stream(run_id))]


def _request(run_id: int, **fields) -> EvaluationRequest:
    return EvaluationRequest(**{"run_id": run_id, "evaluation": 2, "policy_version": 4, "first_task": 5,
                                "tasks": 3, "samples_per_task": 2, "temperature": 0.0, **fields})


def test_an_evaluation_runs_its_held_out_tasks_on_the_kept_version_only(redis_client, redis_url, run_id):
    _set_up(redis_client, run_id)
    assert produce_evaluation(redis_url=redis_url, request=_request(run_id)) == 6
    episodes = _episodes(redis_client, run_id)
    assert sorted((e.task_index, e.sample_index) for e in episodes) == [(t, s) for t in (5, 6, 7) for s in (0, 1)]
    for episode in episodes:
        assert episode.evaluation == 2 and episode.policy_version == 4
        assert set(episode.record.policy_versions) == {4}  # never the live version 9
        prompt = next(message.content for message in episode.record.messages if message.role == "user")
        assert CalculatorEnvironment.is_held_out({"expression": prompt.split("=")[0]})
    # Nothing reaches the trajectory stream the trainer trains from.
    assert redis_client.xlen(trajectory_stream(run_id)) == 0
    # Greedy: every sample of a task is the same episode, and so is a second evaluation of it.
    by_task: dict[int, set] = {}
    for episode in episodes:
        by_task.setdefault(episode.task_index, set()).add(tuple(episode.record.token_ids))
    assert all(len(samples) == 1 for samples in by_task.values())
    redis_client.delete(evaluation_stream(run_id))
    assert produce_evaluation(redis_url=redis_url, request=_request(run_id, evaluation=3)) == 6
    again = {episode.task_index: tuple(episode.record.token_ids) for episode in _episodes(redis_client, run_id)}
    assert again == {task: next(iter(samples)) for task, samples in by_task.items()}


def test_an_evaluation_whose_kept_version_is_gone_runs_nothing(redis_client, redis_url, run_id):
    _set_up(redis_client, run_id)
    assert produce_evaluation(redis_url=redis_url, request=_request(run_id, policy_version=5)) == 0
    assert redis_client.xlen(evaluation_stream(run_id)) == 0


def test_a_slice_that_fails_tells_the_trainer_why_and_never_quotes_a_secret(redis_client, redis_url, run_id,
                                                                           monkeypatch):
    _publish_run(redis_client, run_id, _keyed_spec("EvaluationKeyQuotingEnvironment"))
    secrets_key = run_environment_secrets_key(run_id)
    RedisWeightPublisher(redis_client, key_of=lambda _: evaluation_weights_key(run_id, 4)).publish(
        run_id=run_id, version=4, params=_params(1))
    request = _request(run_id)
    monkeypatch.setenv("REDIS_URL", redis_url)  # the task reads it, as a worker does

    try:
        with pytest.raises(EvaluationSliceError) as raised:
            produce_evaluation_episodes.apply(kwargs={"request": request.model_dump_json()}, throw=True)
    finally:
        redis_client.delete(secrets_key)

    reason = "RuntimeError: the task API refused key [secret api_key]"
    assert str(raised.value) == reason
    (entry,) = [evaluation_stream_record(fields) for _, fields in redis_client.xrange(evaluation_stream(run_id))]
    assert isinstance(entry, EvaluationSliceFailure)
    assert (entry.evaluation, entry.policy_version, entry.first_task, entry.tasks, entry.reason) == (2, 4, 5, 3, reason)
    assert all(API_KEY.encode() not in value for _, fields in redis_client.xrange(evaluation_stream(run_id))
               for value in fields.values())


def test_a_request_naming_another_environment_runs_that_ones_held_out_tasks(redis_client, redis_url, run_id):
    _set_up(redis_client, run_id)
    spec = RunSpec.model_validate_json(redis_client.get(run_spec_key(run_id)))
    guessing = EnvironmentSpec(name="guess", version=2, version_id=77, kind="python",
                               entrypoint="environments.builtin.guessing_game:GuessingGameEnvironment")
    redis_client.set(run_spec_key(run_id), spec.model_copy(update={"evaluation_environments": (guessing,)})
                     .model_dump_json())

    assert produce_evaluation(redis_url=redis_url, request=_request(run_id, environment="guess@2", tasks=2)) == 4

    episodes = _episodes(redis_client, run_id)
    assert {(episode.environment, episode.record.environment) for episode in episodes} == {("guess@2", "guess")}
    assert {episode.policy_version for episode in episodes} == {4}
    # A label the run does not evaluate on is a failed slice, not a guess.
    with pytest.raises(EvaluationSliceError, match="evaluates on no environment 'shout@1'"):
        produce_evaluation(redis_url=redis_url, request=_request(run_id, environment="shout@1"))


def test_an_evaluation_on_an_unhealthy_environment_waits_for_it_and_then_fails_its_slice_with_why(
        redis_client, redis_url, run_id, monkeypatch):
    _set_up(redis_client, run_id)
    spec = RunSpec.model_validate_json(redis_client.get(run_spec_key(run_id)))
    paused = spec.environment.model_copy(update={"version": 3, "version_id": 9_000_000 + run_id % 1000})
    redis_client.set(run_spec_key(run_id), spec.model_copy(update={"environment": paused}).model_dump_json())
    redis_client.set(environment_paused_key(paused.version_id), "its health check timed out", ex=60)
    monkeypatch.setenv("REDIS_URL", redis_url)
    request = _request(run_id)

    with pytest.raises(EnvironmentPausedError, match="calculator@3 is unhealthy: its health check timed out"):
        produce_evaluation(redis_url=redis_url, request=request)
    assert redis_client.xlen(evaluation_stream(run_id)) == 0  # not given up on yet: retried
    # Its retries spent, the slice is given up on with the reason.
    with pytest.raises(EnvironmentPausedError):
        produce_evaluation_episodes.apply(kwargs={"request": request.model_dump_json()}, throw=True,
                                          retries=produce_evaluation_episodes.max_retries)
    (entry,) = [evaluation_stream_record(fields) for _, fields in redis_client.xrange(evaluation_stream(run_id))]
    assert isinstance(entry, EvaluationSliceFailure) and "is unhealthy: its health check timed out" in entry.reason
    redis_client.delete(environment_paused_key(paused.version_id))


class _CountingPolicy:
    """Stands in for the engine's policy: one answer per prompt, after a yield, counting its requests."""

    def __init__(self, fail_on: tuple[int, ...] = ()):
        self.prompts: list[tuple[int, ...]] = []
        self.ended: list[str] = []
        self.fail_on = fail_on

    async def generate(self, prompt, *, session_id=None, extra_stop=()):
        self.prompts.append(tuple(prompt))
        await asyncio.sleep(0)  # its twins ask while it is being generated
        if tuple(prompt) == self.fail_on:
            raise RuntimeError("the engine stopped")
        return Completion(token_ids=[sum(prompt) % 7], logprobs=[-0.5], finished=True, stop_reason="eos")

    def end_session(self, session_id):
        self.ended.append(session_id)


def test_greedy_samples_of_a_task_share_their_turns_until_their_conversations_differ():
    async def scenario():
        turns, policy = SharedGreedyTurns(), _CountingPolicy(fail_on=(9, 9))
        samples = [turns.policy(policy) for _ in range(4)]
        first = await asyncio.gather(*(sample.generate([1, 2, 3], session_id=f"s{i}")
                                       for i, sample in enumerate(samples)))
        # Four samples, one conversation: one request, four equal turns of their own.
        assert policy.prompts == [(1, 2, 3)] and turns.requests == 1
        assert {tuple(turn.token_ids) for turn in first} == {(6,)} and first[0].token_ids is not first[1].token_ids
        # One sample's environment answered otherwise: its next turn is a request of its own.
        await asyncio.gather(samples[0].generate([1, 2, 3, 6, 4], session_id="s0"),
                             samples[1].generate([1, 2, 3, 6, 5], session_id="s1"),
                             samples[2].generate([1, 2, 3, 6, 5], session_id="s2"))
        assert sorted(policy.prompts[1:]) == [(1, 2, 3, 6, 4), (1, 2, 3, 6, 5)] and turns.requests == 3
        # A failed turn fails its twins waiting on it, and is asked again next time.
        results = await asyncio.gather(samples[0].generate([9, 9]), samples[1].generate([9, 9]),
                                       return_exceptions=True)
        assert [type(result) for result in results] == [RuntimeError, RuntimeError]
        with pytest.raises(RuntimeError):
            await samples[2].generate([9, 9])
        assert policy.prompts.count((9, 9)) == 2
        samples[3].end_session("s3")
        assert policy.ended == ["s3"]

    asyncio.run(scenario())
