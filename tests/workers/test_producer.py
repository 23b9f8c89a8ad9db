"""Producers against a real Redis and a real JAX sampler: streaming, masking, and faults."""

from __future__ import annotations

import asyncio
import time

import pytest
from flax import nnx

from environments import Environment, StepResult
from environments.builtin.calculator import CalculatorEnvironment
from policy.model import Transformer, TransformerConfig, split_model
from policy.tokenizer import VOCAB_SIZE
from policy.weights import RedisWeightPublisher
from tandem.configs.rollout import RolloutConfig, SamplingConfig
from tandem.configs.run import ModelConfig, RunConfig
from tandem.contracts import (
    EnvironmentSpec,
    RunSpec,
    TrajectoryRecord,
    run_spec_key,
    trajectory_stream,
)
from workers.episode_loop import process_episode_loop
from workers.policy import PolicyRuntime
from workers.producer import RolloutTaskTimeLimitError, produce, produce_groups


class ExplodingEnvironment(CalculatorEnvironment):
    async def step(self, action):
        raise RuntimeError("environment bug")


class HangingEnvironment(CalculatorEnvironment):
    async def reset(self, task):
        await asyncio.sleep(30)
        return "never"


class NothingFromStepEnvironment(CalculatorEnvironment):
    async def step(self, action):
        return None


class NanRewardEnvironment(CalculatorEnvironment):
    async def step(self, action):
        return StepResult(observation="", reward=float("nan"), done=True)


class OversizedResetEnvironment(CalculatorEnvironment):
    async def reset(self, task):
        return "x" * 10_000


class SlowStepEnvironment(CalculatorEnvironment):
    async def step(self, action):
        await asyncio.sleep(0.4)
        return StepResult(observation="go on\n", reward=0.0, done=False)


class TalkativeEnvironment(Environment):
    """Answers every action with an observation; never done, so max_turns ends the episode."""

    def sample_task(self, rng):
        return {}

    async def reset(self, task):
        return "say something\n"

    async def step(self, action):
        return StepResult(observation="again\n", reward=0.25, done=False)


CONFIG = RunConfig(
    model=ModelConfig(d_model=32, num_layers=1, num_heads=2, mlp_dim=64, max_seq_len=128),
    rollout=RolloutConfig(group_size=3, max_turns=2, environment_timeout_s=0.5),
    sampling=SamplingConfig(max_new_tokens=8),
)


def _publish_policy(redis_client, run_id: int, environment: str, entrypoint: str) -> RunSpec:
    model = Transformer(TransformerConfig.from_model_config(CONFIG.model, VOCAB_SIZE), rngs=nnx.Rngs(0))
    RedisWeightPublisher(redis_client).publish(run_id=run_id, version=7, params=split_model(model)[1])
    spec = RunSpec(run_id=run_id, config=CONFIG,
                   environment=EnvironmentSpec(name=environment, kind="python", entrypoint=entrypoint))
    redis_client.set(run_spec_key(run_id), spec.model_dump_json())
    return spec


def _stream_records(redis_client, run_id):
    return [TrajectoryRecord.from_stream_fields(f) for _, f in redis_client.xrange(trajectory_stream(run_id))]


def test_each_finished_episode_is_streamed_with_its_policy_version_and_mask(redis_client, redis_url, run_id):
    _publish_policy(redis_client, run_id, "calculator", "environments.builtin.calculator:CalculatorEnvironment")
    summary = produce(redis_url=redis_url, run_id=run_id, first_group_index=10, num_groups=2)
    assert (summary.episodes, summary.failed) == (6, 0)
    records = _stream_records(redis_client, run_id)
    assert sorted({r.group_id for r in records}) == [f"{run_id}-10", f"{run_id}-11"]
    for record in records:
        assert record.status == "ok" and record.policy_version == 7 and record.policy_versions[0] == 7
        assert len(record.token_ids) == len(record.loss_mask) == len(record.behaviour_logprobs)
        policy_tokens = [lp for lp, m in zip(record.behaviour_logprobs, record.loss_mask, strict=True) if m]
        assert policy_tokens and all(lp <= 0 for lp in policy_tokens)
        assert record.loss_mask[0] == 0  # the prompt is never trained on


def test_environment_observations_are_masked_out_of_the_loss(redis_client, redis_url, run_id):
    spec = _publish_policy(redis_client, run_id, "talkative", f"{__name__}:TalkativeEnvironment")
    runtime = PolicyRuntime(run_id=run_id, config=CONFIG, redis_client=redis_client)
    runtime.refresh_weights(force=True)
    asyncio.run(produce_groups(redis_url=redis_url, spec=spec, runtime=runtime, first_group_index=0, num_groups=1))
    records = _stream_records(redis_client, run_id)
    finished = [r for r in records if r.num_turns == 2]
    assert len(finished) == 3
    observation = list(b"again\n")
    for record in finished:
        ids = record.token_ids
        start = next(i for i in range(len(ids)) if ids[i:i + len(observation)] == observation)
        assert record.loss_mask[start:start + len(observation)] == [0] * len(observation)
        assert record.reward == pytest.approx(0.25 * 2)


@pytest.mark.parametrize(("environment", "reason"), [
    ("ExplodingEnvironment", "step raised RuntimeError: environment bug"),
    ("HangingEnvironment", "reset timed out after 0.5s"),
    ("NothingFromStepEnvironment", "step returned a NoneType, expected StepResult"),
    ("NanRewardEnvironment", "step reward is nan, expected a finite number"),
    ("OversizedResetEnvironment", "reset returned an observation of 10000 chars, more than max_observation_chars=8192"),
])
def test_a_broken_environment_fails_its_episodes_with_a_reason(redis_client, redis_url, run_id, environment,
                                                              reason):
    _publish_policy(redis_client, run_id, environment, f"{__name__}:{environment}")
    summary = produce(redis_url=redis_url, run_id=run_id, first_group_index=0, num_groups=1)
    records = _stream_records(redis_client, run_id)
    assert summary.episodes == 3 and len(records) == 3
    # An untrained policy never writes a valid tool call, so every episode reaches step().
    assert summary.failed == 3
    assert all(r.status == "failed" and r.failure_reason == reason and sum(r.loss_mask) == 0 for r in records)


def test_a_rollout_task_past_its_time_limit_cancels_its_episodes(redis_client, redis_url, run_id):
    """Celery's threads pool enforces no time limit, so the task bounds itself by the run's rollout.timeout_s."""
    rollout = CONFIG.rollout.model_copy(update={"timeout_s": 1.0, "max_turns": 20, "environment_timeout_s": 5.0})
    config = CONFIG.model_copy(update={"rollout": rollout})
    spec = _publish_policy(redis_client, run_id, "slow", f"{__name__}:SlowStepEnvironment")
    redis_client.set(run_spec_key(run_id), spec.model_copy(update={"config": config})
                     .model_dump_json())
    started = time.monotonic()
    with pytest.raises(RolloutTaskTimeLimitError, match=rf"run {run_id}: groups 0\.\.0 did not finish within 1s"):
        produce(redis_url=redis_url, run_id=run_id, first_group_index=0, num_groups=1)
    # 20 turns of 0.4 s would take 8 s; the warm-up before the episodes is not counted.
    assert time.monotonic() - started < 6.0
    assert _stream_records(redis_client, run_id) == []  # cancelled episodes append nothing
    assert process_episode_loop.run(asyncio.sleep(0, result="the loop goes on")) == "the loop goes on"
