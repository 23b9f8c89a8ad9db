"""The producers' policy: one engine per run, sessions per episode, weights from Redis between chunks."""

from __future__ import annotations

import asyncio

from flax import nnx

from policy.model import Transformer, TransformerConfig, split_model
from policy.tokenizer import BOS_ID, VOCAB_SIZE
from policy.weights import RedisWeightPublisher
from tandem.configs.rollout import RolloutConfig, SamplingConfig
from tandem.configs.run import ModelConfig, RunConfig
from tandem.contracts import TrajectoryRecord, trajectory_stream
from trainer.staleness import in_flight_versions, in_queue_versions
from workers.agent import EpisodeLimits, run_episode
from workers.policy import BatchingPolicy, PolicyRuntime
from workers.producer import produce_groups

from .test_producer import TalkativeEnvironment, _publish_policy

CONFIG = RunConfig(
    model=ModelConfig(d_model=32, num_layers=1, num_heads=2, mlp_dim=64, max_seq_len=128),
    rollout=RolloutConfig(group_size=3, max_turns=2, environment_timeout_s=5.0),
    sampling=SamplingConfig(max_new_tokens=24),
)


def _params(seed: int):
    model = Transformer(
        TransformerConfig.from_model_config(CONFIG.model, VOCAB_SIZE), rngs=nnx.Rngs(seed)
    )
    return split_model(model)[1]


class PublishesAfterTheFirstChunk(PolicyRuntime):
    """Publishes version 2 (version 1 is published first) right after a turn's first decode chunk."""

    def __init__(self, *, run_id, redis_client):
        self.publisher = RedisWeightPublisher(redis_client)
        self.publisher.publish(run_id=run_id, version=1, params=_params(0))
        self.polls = 0
        super().__init__(run_id=run_id, config=CONFIG, redis_client=redis_client, weight_poll_s=0.0)

    def refresh_weights(self, *, force=False):
        self.polls += 1
        if self.polls == 3:  # 1: the caller's forced poll, 2: before chunk 1, 3: before chunk 2
            self.publisher.publish(run_id=self.run_id, version=2, params=_params(1))
        return super().refresh_weights(force=force)


def test_a_weight_update_lands_mid_turn_without_draining_it(redis_client, run_id):
    runtime = PublishesAfterTheFirstChunk(run_id=run_id, redis_client=redis_client)
    runtime.refresh_weights(force=True)
    runtime.warm_up()
    traces_after_warm_up = runtime.engine.trace_counts
    policy = BatchingPolicy(runtime, seed=0)

    async def two_turns():
        first = await policy.generate([BOS_ID, 65, 66], session_id="episode")
        second = await policy.generate([BOS_ID, 65, 66, *first.token_ids, 67], session_id="episode")
        await policy.close()
        return first, second

    try:
        first, second = asyncio.run(two_turns())
    finally:
        runtime.close()
    assert len(first.token_ids) > 8  # the turn outlived its first chunk (8 tokens)
    assert (first.policy_version, first.last_policy_version) == (1, 2)
    assert second.policy_version == 2 and runtime.policy_version == 2
    # Weights fetched from Redis have the shapes and dtypes compiled for: nothing retraced.
    assert set(traces_after_warm_up) == {"init_cache", "prefill", "decode"}
    assert runtime.engine.trace_counts == traces_after_warm_up
    assert runtime.engine.session_count == 0  # close() ended the session


def test_episodes_reuse_their_prefix_across_turns_and_free_their_slots(
    redis_client, redis_url, run_id
):
    spec = _publish_policy(
        redis_client, run_id, "talkative", "tests.workers.test_producer:TalkativeEnvironment"
    )
    runtime = PolicyRuntime(run_id=run_id, config=CONFIG, redis_client=redis_client)
    runtime.refresh_weights(force=True)
    try:
        asyncio.run(
            produce_groups(
                redis_url=redis_url, spec=spec, runtime=runtime, first_group_index=0, num_groups=2
            )
        )
    finally:
        runtime.close()
    records = [
        TrajectoryRecord.from_stream_fields(f)
        for _, f in redis_client.xrange(trajectory_stream(run_id))
    ]
    assert len(records) == 6 and all(r.num_turns == 2 for r in records)
    stats = runtime.engine.stats
    # Turn 2 of each episode found its first prompt and first generation in the cache,
    # so the only tokens prefilled were the first prompts and the observations ("again\n").
    first_turn_ends = [r.loss_mask.index(0, r.loss_mask.index(1)) for r in records]
    first_prompts = [r.loss_mask.index(1) for r in records]
    assert stats.reused_tokens == sum(first_turn_ends)
    assert stats.prefill_tokens == sum(first_prompts) + len(records) * len("again\n")
    assert stats.evictions == 0
    assert all(r.policy_versions == [7, 7] for r in records)
    assert runtime.engine.session_count == 0  # every episode ended its session


def test_the_engine_has_a_row_for_every_episode_of_every_task_thread_by_default():
    from tandem.configs.run import RunConfig
    from workers.policy import inference_slots

    config = RunConfig.model_validate({"rollout": {"group_size": 8, "groups_per_task": 2}})
    assert inference_slots(config) == 16
    assert inference_slots(config, task_concurrency=4) == 64
    assert inference_slots(config, task_concurrency=100) == 256
    assert inference_slots(RunConfig.model_validate({"sampling": {"inference_slots": 12}}), task_concurrency=4) == 12


def test_a_failed_warm_up_is_logged_and_buckets_compile_on_first_use(redis_client, run_id, caplog):
    runtime = PolicyRuntime(run_id=run_id, config=CONFIG, redis_client=redis_client, weight_poll_s=0.0)
    try:
        runtime.warm_up()  # before the first weights: the engine refuses to warm up
        assert "warming up the inference engine failed" in caplog.text
        RedisWeightPublisher(redis_client).publish(run_id=run_id, version=1, params=_params(0))
        runtime.refresh_weights(force=True)
        runtime.warm_up()  # tried once already: nothing happens

        async def one_turn():
            policy = BatchingPolicy(runtime, seed=0)
            completion = await policy.generate([BOS_ID, 65, 66], session_id="episode")
            await policy.close()
            return completion

        completion = asyncio.run(one_turn())
    finally:
        runtime.close()
    assert caplog.text.count("warming up the inference engine failed") == 1
    assert completion.token_ids and completion.policy_version == 1


def test_an_episode_records_weights_that_changed_within_a_turn(redis_client, run_id):
    """Staleness splits into in flight and in queue by the newest version of any token, not of any turn's first."""
    runtime = PublishesAfterTheFirstChunk(run_id=run_id, redis_client=redis_client)
    runtime.refresh_weights(force=True)
    policy = BatchingPolicy(runtime, seed=0)
    limits = EpisodeLimits(max_turns=1, max_seq_len=CONFIG.model.max_seq_len, max_new_tokens=CONFIG.sampling.max_new_tokens,
                           environment_timeout_s=5.0)

    async def one_turn():
        try:
            return await run_episode(run_id=run_id, group_id=f"{run_id}-0", group_size=1, environment_name="talkative",
                                     environment=TalkativeEnvironment(), task={}, policy=policy, limits=limits)
        finally:
            await policy.close()

    try:
        record = asyncio.run(one_turn())
    finally:
        runtime.close()
    # The talkative environment never ends an episode: its one turn (max_turns) does.
    assert record.status == "truncated", record.failure_reason
    assert sum(record.loss_mask) > 8  # the turn outlived its first chunk (8 tokens)
    assert record.policy_versions == [1] and record.newest_policy_version == 2
    assert in_flight_versions(record) == 1 and in_queue_versions(record, policy_version=2) == 0


def test_the_next_runtime_of_the_same_model_skips_the_warm_up_its_kernels_had(redis_client, run_id):
    """Engines of one shape share their compiled kernels: a later runtime's warm-up has nothing to
    compile, so it does not run every bucket again, and its episodes trace nothing new."""
    RedisWeightPublisher(redis_client).publish(run_id=run_id, version=1, params=_params(0))
    first = PolicyRuntime(run_id=run_id, config=CONFIG, redis_client=redis_client)
    first.refresh_weights(force=True)
    first.engine.warmup()  # this shape's buckets compiled, whatever ran before in this process
    first.close()
    later = PolicyRuntime(run_id=run_id, config=CONFIG, redis_client=redis_client)
    later.refresh_weights(force=True)
    traces = later.engine.trace_count
    assert later.engine.warmup() is False
    policy = BatchingPolicy(later, seed=0)

    async def one_turn():
        completion = await policy.generate([BOS_ID, 65, 66], session_id="episode")
        await policy.close()
        return completion

    try:
        completion = asyncio.run(one_turn())
    finally:
        later.close()
    assert completion.token_ids
    assert later.engine.trace_count == traces
