"""The transformer's cached decode against full forward passes (the engine: engine/test_engine.py).

Logit comparisons use an absolute tolerance of 1e-4 (float32, different
summation orders between the cached and the full path).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from policy.model import Transformer, TransformerConfig, count_parameters, split_model
from policy.tokenizer import BOS_ID, PAD_ID, VOCAB_SIZE
from tandem.configs.model import ModelConfig

TOLERANCE = 1e-4

CONFIG = TransformerConfig(
    vocab_size=VOCAB_SIZE, d_model=32, num_layers=2, num_heads=2, mlp_dim=64, max_seq_len=64
)


@pytest.fixture(scope="module")
def model() -> Transformer:
    return Transformer(CONFIG, rngs=nnx.Rngs(0))


def _random_tokens(seed: int, length: int) -> list[int]:
    return [BOS_ID, *np.random.default_rng(seed).integers(0, 256, length - 1).tolist()]


def _left_padded(sequences: list[list[int]], width: int) -> tuple[jax.Array, ...]:
    tokens = np.full((len(sequences), width), PAD_ID, np.int32)
    mask = np.zeros((len(sequences), width), np.bool_)
    for row, sequence in enumerate(sequences):
        tokens[row, width - len(sequence) :] = sequence
        mask[row, width - len(sequence) :] = True
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
    return jnp.asarray(tokens), jnp.asarray(positions), jnp.asarray(mask)


def test_config_comes_from_the_run_config():
    config = TransformerConfig.from_model_config(ModelConfig(), vocab_size=VOCAB_SIZE)
    assert (config.d_model, config.num_heads, config.vocab_size) == (64, 4, VOCAB_SIZE)
    with pytest.raises(ValueError, match="num_heads"):
        TransformerConfig(
            VOCAB_SIZE, d_model=30, num_layers=1, num_heads=4, mlp_dim=8, max_seq_len=16
        )


@pytest.mark.parametrize(
    "architecture, message",
    [
        (dict(d_model=30, num_heads=4), "num_heads must divide d_model (or set head_dim)"),
        (dict(num_heads=4, num_kv_heads=3), "num_kv_heads must divide num_heads"),
        (dict(d_model=24, num_heads=8), "head_dim must be even"),
        (dict(num_heads=2, head_dim=9), "head_dim must be even"),
        (dict(rope_scaling={"rope_type": "yarn", "factor": 2.0}), "rope_type must be 'llama3'"),
        (dict(rope_scaling={"factor": 8.0}), "rope_scaling lacks keys"),
        (
            dict(rope_scaling={"factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
                               "original_max_position_embeddings": 64}),
            "must exceed low_freq_factor",
        ),
    ],
)
def test_the_run_config_and_the_model_refuse_the_same_architectures_alike(architecture, message):
    # One set of rules (tandem.configs.model): a config the platform accepts is one the trainer builds.
    fields = dict(d_model=64, num_layers=1, num_heads=4, mlp_dim=16, max_seq_len=16) | architecture
    with pytest.raises(ValueError, match=re.escape(message)):
        ModelConfig(**fields)
    with pytest.raises(ValueError, match=re.escape(message)):
        TransformerConfig(vocab_size=VOCAB_SIZE, **fields)


def test_parameter_count_matches_the_architecture(model):
    d, v, m, layers = CONFIG.d_model, CONFIG.vocab_size, CONFIG.mlp_dim, CONFIG.num_layers
    # Embedding and untied head; per block 4 attention projections, 3 MLP matrices, 2 norms.
    per_block = 4 * d * d + 3 * d * m + 2 * d
    assert count_parameters(model) == 2 * v * d + layers * per_block + d


def test_left_and_right_padding_give_the_same_logits_for_real_tokens(model):
    sequences = [_random_tokens(1, 10), _random_tokens(2, 6)]
    left_tokens, left_positions, left_mask = _left_padded(sequences, 12)
    left = model(left_tokens, left_positions, left_mask)

    right_tokens = np.full((2, 12), PAD_ID, np.int32)
    for row, sequence in enumerate(sequences):
        right_tokens[row, : len(sequence)] = sequence
    right_mask = right_tokens != PAD_ID
    right = model(
        jnp.asarray(right_tokens),
        jnp.broadcast_to(jnp.arange(12, dtype=jnp.int32), (2, 12)),
        jnp.asarray(right_mask),
    )

    for row, sequence in enumerate(sequences):
        np.testing.assert_allclose(
            left[row, 12 - len(sequence) :], right[row, : len(sequence)], atol=TOLERANCE
        )
    assert bool(jnp.all(jnp.isfinite(left)))


def test_cached_decode_matches_the_full_forward_pass_with_left_padding(model):
    sequences = [_random_tokens(3, 11), _random_tokens(4, 5)]
    width, prefill = 12, 7
    tokens, positions, mask = _left_padded(sequences, width)
    full = model(tokens, positions, mask)

    cache_len = 16
    key_mask = jnp.concatenate([mask, jnp.ones((2, cache_len - width), jnp.bool_)], axis=1)
    graphdef, params = split_model(model)

    @jax.jit
    def decode(params, tokens, positions, cache, cache_index):
        return nnx.merge(graphdef, params).decode(tokens, positions, cache, cache_index, key_mask)

    cache = model.init_cache(2, cache_len, jnp.float32)
    logits, cache = decode(params, tokens[:, :prefill], positions[:, :prefill], cache, 0)
    decoded = [logits]
    for slot in range(prefill, width):
        logits, cache = decode(
            params, tokens[:, slot : slot + 1], positions[:, slot : slot + 1], cache, slot
        )
        decoded.append(logits)
    decoded = jnp.concatenate(decoded, axis=1)

    real = np.asarray(mask)
    np.testing.assert_allclose(np.asarray(decoded)[real], np.asarray(full)[real], atol=TOLERANCE)


def test_decode_with_logits_at_gives_those_positions_logits_and_the_same_cache(model):
    sequences = [_random_tokens(5, 11), _random_tokens(6, 5)]
    width, cache_len = 12, 16
    tokens, positions, mask = _left_padded(sequences, width)
    key_mask = jnp.concatenate([mask, jnp.ones((2, cache_len - width), jnp.bool_)], axis=1)
    last = jnp.asarray([width - 1, width - 4], jnp.int32)

    full, full_cache = model.decode(
        tokens, positions, model.init_cache(2, cache_len, jnp.float32), 0, key_mask
    )
    picked, picked_cache = model.decode(
        tokens, positions, model.init_cache(2, cache_len, jnp.float32), 0, key_mask, logits_at=last
    )

    assert picked.shape == (2, 1, full.shape[-1])
    np.testing.assert_allclose(
        np.asarray(picked[:, 0]), np.asarray(full)[np.arange(2), np.asarray(last)], atol=TOLERANCE
    )
    for full_layer, picked_layer in zip(full_cache, picked_cache, strict=True):
        np.testing.assert_array_equal(np.asarray(full_layer["key"]), np.asarray(picked_layer["key"]))


@pytest.mark.parametrize("window", [None, 5])
def test_attention_a_chunk_of_queries_at_a_time_gives_the_whole_attention_and_its_gradients(window):
    # Two packed rows of 40 slots: segments of 13, 20 and 7 tokens, then 30 and 10 of padding. Chunks of
    # 16 queries attend to the keys before their last slot (and, sliding, within the window) only.
    from policy.model import _attend, _attend_in_query_chunks

    rng = np.random.default_rng(3)
    query, key, value = (jnp.asarray(rng.standard_normal(shape), jnp.float32)
                         for shape in ((2, 40, 4, 8), (2, 2, 40, 8), (2, 2, 40, 8)))
    segments = jnp.asarray([[1] * 13 + [2] * 20 + [3] * 7, [1] * 30 + [0] * 10], jnp.int32)
    real = np.asarray(segments > 0)

    def whole(query, key, value):
        slots = jnp.broadcast_to(jnp.arange(40, dtype=jnp.int32), (2, 40))
        return _attend(query, key, value, slots, segments, scale=0.3, window=window)

    def chunked(query, key, value):
        return _attend_in_query_chunks(query, key, value, segments, scale=0.3, window=window, chunk=16)

    np.testing.assert_allclose(np.asarray(chunked(query, key, value))[real],
                               np.asarray(whole(query, key, value))[real], atol=1e-6)
    # Gradients of a loss on the real tokens, through the checkpointed chunks.
    weights = jnp.asarray(rng.standard_normal((2, 40, 4, 8)), jnp.float32) * real[:, :, None, None]
    gradients = [jax.grad(lambda *inputs, attend=attend: jnp.sum(attend(*inputs) * weights), argnums=(0, 1, 2))(
        query, key, value) for attend in (whole, chunked)]
    for expected, actual in zip(*gradients, strict=True):
        np.testing.assert_allclose(actual, expected, atol=1e-5)
    assert float(jnp.abs(gradients[0][1]).sum()) > 0
