"""LoRA: adapters added after construction, published alone, folded back for producers."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from policy.lora import FrozenParam, LoRALinear, apply_lora, fold_adapters, split_adapters
from policy.model import Transformer, TransformerConfig, split_model
from policy.tokenizer import PAD_ID, VOCAB_SIZE
from policy.weights import RedisWeightPublisher, RedisWeightSubscriber
from tandem.configs.parallelism import LoRAConfig
from tandem.configs.run import RunConfig
from tandem.contracts import weights_key
from trainer.losses import sft_loss
from trainer.token_statistics import logits_token_statistics
from trainer.train_batch import pad_batch
from trainer.train_state import create_train_state
from trainer.train_step import make_train_step, on_token_statistics
from trainer.value_head import with_value_head
from workers.policy import PolicyRuntime

# The run config's default policy, so the bytes below are the demo's.
RUN_CONFIG = RunConfig()
CONFIG = TransformerConfig.from_model_config(RUN_CONFIG.model, VOCAB_SIZE)
LORA = LoRAConfig(enabled=True, rank=8, alpha=16.0,
                  targets=["attention.query", "attention.value", "mlp.up"])


def _lora_model(seed: int = 0) -> Transformer:
    return apply_lora(Transformer(CONFIG, rngs=nnx.Rngs(seed)), LORA, rngs=nnx.Rngs(seed + 1))


def _batch(seed: int):
    rng = np.random.default_rng(seed)
    sequences = [rng.integers(1, 256, size=int(rng.integers(8, 30))).tolist() for _ in range(4)]
    return pad_batch(sequences, loss_masks=[[0] * 3 + [1] * (len(s) - 3) for s in sequences],
                     behaviour_logprobs=None, advantages=None, batch_size=4,
                     length_buckets=(32,), pad_id=PAD_ID)


def _logits(model: Transformer, batch) -> np.ndarray:
    return np.asarray(model(batch.tokens, batch.positions, batch.attention_mask))


def test_adapters_start_as_a_no_op_on_a_frozen_base():
    model = Transformer(CONFIG, rngs=nnx.Rngs(0))
    batch = _batch(0)
    before = _logits(model, batch)
    query = model.blocks[0].attention.query
    apply_lora(model, LORA, rngs=nnx.Rngs(1))

    adapted = model.blocks[0].attention.query
    # The same kernel variable, retyped as frozen.
    assert isinstance(adapted, LoRALinear) and isinstance(adapted.kernel, FrozenParam)
    np.testing.assert_array_equal(adapted.kernel[...], query.kernel[...])
    assert isinstance(model.blocks[1].mlp.up, LoRALinear)
    assert not isinstance(model.blocks[1].mlp.down, LoRALinear)
    # B starts at zero: the same function as before.
    np.testing.assert_array_equal(_logits(model, batch), before)
    # The base keeps the plain model's structure: adapters are extra leaves.
    _, params = split_model(model)
    adapters, base = split_adapters(params)
    _, plain = split_model(Transformer(CONFIG, rngs=nnx.Rngs(0)))
    assert jax.tree.structure(nnx.to_pure_dict(base)) == jax.tree.structure(nnx.to_pure_dict(plain))
    assert len(jax.tree.leaves(adapters)) == 2 * len(LORA.targets) * CONFIG.num_layers


def test_lora_freezes_the_policy_but_not_a_value_head_added_afterwards():
    policy = _lora_model()
    model = with_value_head(policy, d_model=CONFIG.d_model, rngs=nnx.Rngs(3))
    optimizer = optax.adam(1e-2)
    graphdef, state = create_train_state(model, optimizer)

    def loss_fn(model, batch, totals):
        logits, values = model.logits_and_values(batch.tokens, batch.positions, batch.attention_mask)
        loss, metrics = sft_loss(logits_token_statistics(logits, batch.tokens), batch, totals)
        return loss + jnp.mean((values - 1.0) ** 2), metrics

    train_step = make_train_step(graphdef, optimizer, loss_fn)
    before = jax.tree.map(np.array, state.params)
    for seed in range(2):
        state, _ = train_step(state, _batch(seed))

    changed = {
        jax.tree_util.keystr(path): not np.array_equal(np.asarray(leaf), old)
        for (path, leaf), old in zip(jax.tree_util.tree_leaves_with_path(state.params),
                                     jax.tree.leaves(before), strict=True)
    }
    assert {path for path, moved in changed.items() if moved} == {
        path for path in changed if "lora_" in path or "value_head" in path
    }
    with pytest.raises(ValueError, match="before wrapping the policy"):
        apply_lora(with_value_head(Transformer(CONFIG, rngs=nnx.Rngs(0)), d_model=CONFIG.d_model,
                                   rngs=nnx.Rngs(1)), LORA, rngs=nnx.Rngs(2))


def test_lora_refuses_unknown_targets_and_adapting_twice():
    with pytest.raises(ValueError, match="unknown LoRA targets"):
        LoRAConfig(enabled=True, targets=["attention.qkv"])
    model = _lora_model()
    with pytest.raises(ValueError, match="already has LoRA adapters"):
        apply_lora(model, LORA, rngs=nnx.Rngs(2))
    # Disabled (the default) leaves the model alone.
    plain = Transformer(CONFIG, rngs=nnx.Rngs(0))
    apply_lora(plain, LoRAConfig(), rngs=nnx.Rngs(1))
    assert not isinstance(plain.blocks[0].attention.query, LoRALinear)


def test_folding_adapters_adds_scaled_low_rank_product_to_the_kernel():
    rng = np.random.default_rng(0)
    kernel, a, b = rng.normal(size=(6, 5)), rng.normal(size=(6, 2)), rng.normal(size=(2, 5))
    base = {"blocks": {"0": {"attention": {"query": {"kernel": kernel.astype(np.float32)}},
                             "mlp_norm": {"scale": np.ones(6, np.float32)}}}}
    adapters = {"blocks": {"0": {"attention": {"query": {"lora_a": a, "lora_b": b}}}}}
    folded = fold_adapters(base, adapters, 2.0)
    np.testing.assert_allclose(folded["blocks"]["0"]["attention"]["query"]["kernel"],
                               kernel + 2.0 * a @ b, rtol=1e-6)
    np.testing.assert_array_equal(base["blocks"]["0"]["attention"]["query"]["kernel"],
                                  kernel.astype(np.float32))
    with pytest.raises(ValueError, match="no base parameters"):
        fold_adapters(base, {"blocks": {"0": {"attention": {"keys": {"lora_a": a}}}}}, 1.0)


def test_adapter_only_publishes_round_trip_through_redis_into_the_trainers_model(redis_client, run_id):
    optimizer = optax.adam(1e-2)
    graphdef, state = create_train_state(_lora_model(), optimizer)
    train_step = make_train_step(graphdef, optimizer, on_token_statistics(sft_loss))
    publisher = RedisWeightPublisher(redis_client, lora=LORA)
    batch = _batch(1)

    sizes = []
    for version in range(3):
        state, _ = train_step(state, _batch(10 + version))
        sizes.append(publisher.publish(run_id=run_id, version=version, params=state.params))
    # First the base and the adapters, then adapters alone.
    stored = redis_client.hgetall(weights_key(run_id))
    assert int(stored[b"version"]) == 2 and int(stored[b"base_version"]) == 0
    assert b"blob_chunks" not in stored and stored[b"adapters_chunks"].startswith(b"2:")
    adapter_chunks = [value for field, value in stored.items() if field.startswith(b"adapters:2:")]
    assert sizes[1] == sizes[2] == sum(map(len, adapter_chunks)) < sizes[0] / 10
    # Only the newest adapters are kept beside the base.
    assert not [field for field in stored if field.startswith((b"adapters:0:", b"adapters:1:"))]

    # A producer, unchanged: it builds the plain model and gets the adapters folded in.
    plain_graphdef, plain_like = split_model(
        nnx.eval_shape(lambda: Transformer(CONFIG, rngs=nnx.Rngs(0)))
    )
    runtime = PolicyRuntime(run_id=run_id, config=RUN_CONFIG, redis_client=redis_client)
    try:
        assert runtime.refresh_weights(force=True) == 2
        producer_model = nnx.merge(plain_graphdef, runtime.params)
        trainer_model = nnx.merge(graphdef, state.params)
        assert not isinstance(producer_model.blocks[0].attention.query, LoRALinear)
        # Folding reorders float sums (x @ (W + sAB) vs x @ W + s(xA)B); logits are O(1).
        np.testing.assert_allclose(_logits(producer_model, batch), _logits(trainer_model, batch),
                                   atol=2e-5, rtol=0)

        # The next version reuses the subscriber's cached base.
        state, _ = train_step(state, _batch(20))
        assert publisher.publish(run_id=run_id, version=3, params=state.params) == sizes[1]
        assert runtime.refresh_weights(force=True) == 3
        np.testing.assert_allclose(
            _logits(nnx.merge(plain_graphdef, runtime.params), batch),
            _logits(nnx.merge(graphdef, state.params), batch), atol=2e-5, rtol=0,
        )
    finally:
        runtime.close()
    # A restarted trainer's publisher does not know the base is there: it sends it again.
    restarted = RedisWeightPublisher(redis_client, lora=LORA)
    assert restarted.publish(run_id=run_id, version=4, params=state.params) == sizes[0]

    # Without LoRA every version carries every parameter.
    full_graphdef, full_state = create_train_state(Transformer(CONFIG, rngs=nnx.Rngs(0)), optimizer)
    full_bytes = RedisWeightPublisher(redis_client).publish(
        run_id=run_id + 1, version=0, params=full_state.params
    )
    fetched = RedisWeightSubscriber(redis_client).fetch(run_id + 1, plain_like)
    np.testing.assert_array_equal(_logits(nnx.merge(full_graphdef, fetched[1]), batch),
                                  _logits(nnx.merge(full_graphdef, full_state.params), batch))
    redis_client.delete(weights_key(run_id), weights_key(run_id + 1))
    print(json.dumps({
        "model": RUN_CONFIG.model.model_dump(), "lora": LORA.model_dump(),
        "bytes_per_version_full_finetuning": full_bytes,
        "bytes_first_lora_version": sizes[0], "bytes_per_later_lora_version": sizes[1],
    }))


def test_a_publisher_without_lora_config_refuses_adapters(redis_client, run_id):
    _, state = create_train_state(_lora_model(), optax.sgd(0.1))
    with pytest.raises(ValueError, match="lora="):
        RedisWeightPublisher(redis_client).publish(run_id=run_id, version=0, params=state.params)
    assert not redis_client.exists(weights_key(run_id))
