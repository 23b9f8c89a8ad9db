"""No silent truncation: episodes the budget cuts off end ``truncated`` with their reason; prompts too long fail.

Every episode runs through a real inference engine (a nano policy, weights
published to the real Redis); one runs through the real SmolLM2 tokenizer and
its chat template, with a nano model of its vocabulary.
"""

from __future__ import annotations

import asyncio

import pytest
from flax import nnx

from environments.base import Environment, StepResult
from environments.builtin.calculator import CalculatorEnvironment
from policy import load_tokenizer
from policy.model import Transformer, TransformerConfig, split_model
from policy.tokenizer import VOCAB_SIZE
from policy.weights import RedisWeightPublisher
from tandem.configs.rollout import RolloutConfig, SamplingConfig
from tandem.configs.run import ModelConfig, RunConfig
from workers.agent import EpisodeLimits, run_episode
from workers.policy import BatchingPolicy, PolicyRuntime

NANO = dict(d_model=32, num_layers=1, num_heads=2, mlp_dim=64)


class Talkative(Environment):
    """Never done: ``feedback`` after every action."""

    def __init__(self, *, prompt: str = "say something\n", feedback: str = "again\n"):
        self.prompt, self.feedback = prompt, feedback

    def sample_task(self, rng):
        return {}

    async def reset(self, task):
        return self.prompt

    async def step(self, action):
        return StepResult(observation=self.feedback, reward=0.25, done=False)


def _episodes(redis_client, run_id, config: RunConfig, environment_factory, *, count=1, vocab_size=VOCAB_SIZE):
    model = Transformer(TransformerConfig.from_model_config(config.model, vocab_size), rngs=nnx.Rngs(0))
    RedisWeightPublisher(redis_client).publish(run_id=run_id, version=1, params=split_model(model)[1])
    runtime = PolicyRuntime(run_id=run_id, config=config, redis_client=redis_client)
    runtime.refresh_weights(force=True)
    policy = BatchingPolicy(runtime, seed=0)
    limits = EpisodeLimits(max_turns=config.rollout.max_turns, max_seq_len=config.model.max_seq_len,
                           max_new_tokens=config.sampling.max_new_tokens, environment_timeout_s=5.0)

    async def episodes():
        try:
            return await asyncio.gather(*[
                run_episode(run_id=run_id, group_id=f"{run_id}-0", group_size=count, environment_name="env",
                            environment=environment_factory(), task={"expression": "2+3"}, policy=policy,
                            limits=limits, tokenizer=runtime.tokenizer, layout=runtime.prompt_layout)
                for _ in range(count)])
        finally:
            await policy.close()

    try:
        return asyncio.run(episodes())
    finally:
        runtime.close()


def _config(*, max_seq_len=128, max_turns=2, max_new_tokens=8, **model) -> RunConfig:
    return RunConfig(model=ModelConfig(**{**NANO, **model}, max_seq_len=max_seq_len),
                     rollout=RolloutConfig(group_size=2, max_turns=max_turns),
                     sampling=SamplingConfig(max_new_tokens=max_new_tokens))


def test_max_turns_and_max_seq_len_end_episodes_truncated_with_the_reward_so_far(redis_client, run_id):
    (by_turns,) = _episodes(redis_client, run_id, _config(max_turns=2), Talkative)
    assert by_turns.status == "truncated" and by_turns.num_turns == 2
    assert by_turns.failure_reason == "reached max_turns=2 before the environment ended the episode"
    assert by_turns.reward == pytest.approx(0.5) and sum(by_turns.loss_mask) > 0  # trained, not failed

    # 60 bytes of feedback after each turn of up to 8 tokens: the third turn has no room in 128.
    (by_length,) = _episodes(redis_client, run_id + 1, _config(max_turns=10),
                             lambda: Talkative(feedback="x" * 60))
    assert by_length.status == "truncated" and len(by_length.token_ids) <= 128
    assert "max_seq_len=128" in by_length.failure_reason
    assert by_length.failure_reason.startswith(("no room for turn", "the environment's observation after turn"))
    if by_length.failure_reason.startswith("no room for turn"):  # the next turn's budget is what did not fit
        assert "max_new_tokens=8" in by_length.failure_reason
    # Nothing was cut mid-message: the record ends where its last message does.
    assert by_length.messages[-1].end == len(by_length.token_ids)


def test_a_prompt_that_alone_exceeds_the_budget_fails_its_episodes_with_the_numbers(redis_client, run_id):
    records = _episodes(redis_client, run_id, _config(max_seq_len=64, max_new_tokens=8),
                        lambda: Talkative(prompt="p" * 80), count=2)
    for record in records:
        assert record.status == "failed" and sum(record.loss_mask) == 0 and record.num_turns == 0
        assert record.failure_reason.startswith("the prompt alone leaves no room for a turn: 81 tokens")
        assert "max_new_tokens=8" in record.failure_reason and "max_seq_len=64" in record.failure_reason


def test_a_live_episode_is_rendered_with_the_tokenizers_chat_template(redis_client, run_id, smollm2):
    tokenizer = load_tokenizer(str(smollm2))
    config = _config(max_seq_len=512, max_turns=1, max_new_tokens=6, tokenizer=str(smollm2))
    (record,) = _episodes(redis_client, run_id, config, CalculatorEnvironment, vocab_size=tokenizer.vocab_size)
    assert record.status in ("ok", "truncated"), record.failure_reason
    text = tokenizer._tokenizer.decode(record.token_ids, skip_special_tokens=False)
    # The template's own layout, with the calculator's tool in a system message (SmolLM2's template knows no tools).
    assert text.startswith("<|im_start|>system\nYou may call these tools")
    assert "<|im_start|>user\n2+3=?\n<|im_end|>\n<|im_start|>assistant\n" in text
    assert [message.role for message in record.messages] == ["system", "user", "assistant"]
    assistant = record.messages[2]
    sampled = [index for index, mask in enumerate(record.loss_mask) if mask]
    # Only sampled tokens are trained: after the generation prompt, at most max_new_tokens of them.
    assert sampled and sampled[0] > assistant.start and len(sampled) <= 6
    assert record.behaviour_logprobs[sampled[0]] != 0.0
    assert assistant.content == tokenizer.decode([record.token_ids[i] for i in sampled])
