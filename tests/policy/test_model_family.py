"""The transformer family: per-row cache offsets, GQA / QK-norm caches, dtypes, presets.

Logit comparisons use an absolute tolerance of 1e-4 (float32; the batched, the
cached and the full paths sum in different orders), except the bfloat16 check
(0.1, stated there).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from policy.model import (
    RopeScaling,
    Transformer,
    TransformerConfig,
    count_parameters,
    preset,
    split_model,
)
from policy.tokenizer import VOCAB_SIZE
from tandem.configs.model import ModelConfig
from tests.policy.factories import decode, forward, random_model

TOLERANCE = 1e-4

GQA = TransformerConfig(
    vocab_size=64, d_model=32, num_layers=2, num_heads=4, num_kv_heads=2, mlp_dim=64, max_seq_len=32
)
# Every optional feature at once: explicit head_dim != d_model / num_heads, QK-norm,
# QKV bias, Llama-3 rope scaling (active below the test lengths), tied embeddings.
EVERYTHING = TransformerConfig(
    vocab_size=64,
    d_model=32,
    num_layers=2,
    num_heads=4,
    num_kv_heads=1,
    head_dim=12,
    mlp_dim=64,
    max_seq_len=32,
    rope_theta=500.0,
    rope_scaling={
        "rope_type": "llama3",
        "factor": 4.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8,
    },
    rms_norm_eps=1e-5,
    qkv_bias=True,
    qk_norm=True,
    tie_embeddings=True,
)

def _decode_one_row(model, tokens, prompt_len, new_tokens, cache_len):
    """Prefill row ``tokens`` alone (real up to ``prompt_len``), decode ``new_tokens`` after it."""
    cache = model.init_cache(1, cache_len)
    mask = np.zeros((1, cache_len), np.bool_)
    mask[0, : prompt_len + len(new_tokens)] = True
    prompt_positions = np.arange(len(tokens), dtype=np.int32)[None]
    _, cache = decode(model, np.asarray([tokens]), prompt_positions, cache, np.int32(0), mask)
    positions = prompt_len + np.arange(len(new_tokens), dtype=np.int32)[None]
    logits, _ = decode(
        model, np.asarray([new_tokens]), positions, cache, np.int32(prompt_len), mask
    )
    return np.asarray(logits[0])


def test_rows_at_different_cache_offsets_match_each_row_decoded_alone():
    model = random_model(GQA, 0)
    rng = np.random.default_rng(0)
    prompt_lengths, width, cache_len = [3, 6], 6, 12
    new_tokens = rng.integers(0, 64, (2, 2)).astype(np.int32)

    # Prefill both prompts right-padded at offset 0, so each row's next slot differs.
    tokens = rng.integers(0, 64, (2, width)).astype(np.int32)
    mask = np.zeros((2, cache_len), np.bool_)
    for row, length in enumerate(prompt_lengths):
        mask[row, : length + new_tokens.shape[1]] = True
    positions = np.broadcast_to(np.arange(width, dtype=np.int32), (2, width))
    cache = model.init_cache(2, cache_len)
    _, cache = decode(model, tokens, positions, cache, np.int32(0), mask)

    offsets = np.asarray(prompt_lengths, np.int32)
    new_positions = offsets[:, None] + np.arange(2, dtype=np.int32)[None]
    logits, updated = decode(model, new_tokens, new_positions, cache, offsets, mask)

    for row, length in enumerate(prompt_lengths):
        alone = _decode_one_row(model, tokens[row], length, new_tokens[row], cache_len)
        np.testing.assert_allclose(np.asarray(logits[row]), alone, atol=TOLERANCE)
        # The new keys landed at the row's own offset and nowhere else.
        before, after = np.asarray(cache[0]["key"][row]), np.asarray(updated[0]["key"][row])
        changed = np.flatnonzero(np.any(before != after, axis=(0, 2)))  # [KV, L, Dh]
        np.testing.assert_array_equal(changed, [length, length + 1])


def test_a_scalar_cache_index_still_means_the_same_offset_for_every_row():
    model = random_model(GQA, 1)
    tokens = np.random.default_rng(1).integers(0, 64, (2, 6)).astype(np.int32)
    positions = np.broadcast_to(np.arange(6, dtype=np.int32), (2, 6))
    mask = np.zeros((2, 12), np.bool_)
    mask[:, :6] = True
    scalar, _ = decode(model, tokens, positions, model.init_cache(2, 12), np.int32(0), mask)
    vector, _ = decode(
        model, tokens, positions, model.init_cache(2, 12), np.zeros(2, np.int32), mask
    )
    full = forward(model, tokens, positions, mask[:, :6])
    np.testing.assert_allclose(np.asarray(scalar), np.asarray(vector), atol=TOLERANCE)
    np.testing.assert_allclose(np.asarray(scalar), np.asarray(full), atol=TOLERANCE)


@pytest.mark.parametrize("config", [GQA, EVERYTHING], ids=["gqa", "qk_norm_and_the_rest"])
def test_cached_decode_matches_the_full_forward(config):
    model = random_model(config, 2)
    rng = np.random.default_rng(2)
    lengths, prompt_len, width = [12, 7], 4, 12
    tokens = rng.integers(0, 64, (2, width)).astype(np.int32)
    mask = np.arange(width)[None, :] < np.asarray(lengths)[:, None]
    positions = np.broadcast_to(np.arange(width, dtype=np.int32), (2, width))
    full = np.asarray(forward(model, tokens, positions, mask))

    cache = model.init_cache(2, width)
    assert cache[0]["key"].shape == (2, config.num_kv_heads, width, config.head_dim)
    logits, cache = decode(
        model, tokens[:, :prompt_len], positions[:, :prompt_len], cache, np.int32(0), mask
    )
    stepped = [np.asarray(logits)]
    for slot in range(prompt_len, width):
        step = slice(slot, slot + 1)
        logits, cache = decode(
            model, tokens[:, step], positions[:, step], cache, np.int32(slot), mask
        )
        stepped.append(np.asarray(logits))
    stepped = np.concatenate(stepped, axis=1)
    np.testing.assert_allclose(stepped[mask], full[mask], atol=TOLERANCE)


def test_logits_are_the_head_of_the_float32_hidden_states():
    model = random_model(EVERYTHING, 3)
    tokens = np.random.default_rng(3).integers(0, 64, (2, 6)).astype(np.int32)
    positions = np.broadcast_to(np.arange(6, dtype=np.int32), (2, 6))
    mask = np.ones((2, 6), np.bool_)
    hidden, logits = nnx.jit(
        lambda model: (model.hidden_states(tokens, positions, mask), model(tokens, positions, mask))
    )(model)
    assert hidden.shape == (2, 6, 32) and hidden.dtype == jnp.float32
    np.testing.assert_allclose(
        np.asarray(logits), np.asarray(hidden @ model.embedding.embedding[...].T), atol=1e-5
    )
    assert model.head is None  # tied: the embedding is the head
    assert model.blocks[0].attention.query.kernel[...].shape == (32, 4 * 12)
    assert model.blocks[0].attention.key.kernel[...].shape == (32, 12)
    assert model.blocks[0].attention.query_norm.scale[...].shape == (12,)


def test_bfloat16_parameters_give_float32_logits_close_to_float32_parameters():
    float32_model = random_model(GQA, 4)
    graphdef, _ = split_model(
        nnx.eval_shape(
            lambda: Transformer(dataclasses.replace(GQA, param_dtype="bfloat16"), rngs=nnx.Rngs(0))
        )
    )
    bfloat16_params = jax.tree.map(lambda p: p.astype(jnp.bfloat16), split_model(float32_model)[1])
    model = nnx.merge(graphdef, bfloat16_params)
    tokens = np.random.default_rng(4).integers(0, 64, (2, 12)).astype(np.int32)
    positions = np.broadcast_to(np.arange(12, dtype=np.int32), (2, 12))
    mask = np.ones((2, 12), np.bool_)
    logits = forward(model, tokens, positions, mask)
    assert logits.dtype == jnp.float32
    reference = np.asarray(forward(float32_model, tokens, positions, mask))
    # bfloat16 keeps 8 mantissa bits: a few percent of the logit scale (~3 here).
    np.testing.assert_allclose(np.asarray(logits), reference, atol=0.15)


def test_the_default_run_config_is_the_nano_preset_and_new_fields_map_through():
    assert TransformerConfig.from_model_config(ModelConfig(), vocab_size=VOCAB_SIZE) == preset(
        "nano"
    )
    model_config = ModelConfig(
        d_model=64,
        num_heads=8,
        num_kv_heads=2,
        head_dim=16,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8,
            "low_freq_factor": 1,
            "high_freq_factor": 4,
            "original_max_position_embeddings": 64,
        },
        qk_norm=True,
        tie_embeddings=True,
        param_dtype="bfloat16",
    )
    config = TransformerConfig.from_model_config(model_config, vocab_size=100)
    assert (config.num_kv_heads, config.head_dim, config.qk_norm) == (2, 16, True)
    assert config.rope_scaling == RopeScaling(8.0, 1.0, 4.0, 64)
    assert config.dtype == jnp.bfloat16
    hash(config)  # keys jit caches
    with pytest.raises(ValueError, match="num_kv_heads"):
        ModelConfig(num_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match="rope_scaling"):
        ModelConfig(rope_scaling={"rope_type": "yarn", "factor": 2})
    with pytest.raises(ValueError, match="num_kv_heads"):
        TransformerConfig(
            64, d_model=32, num_layers=1, num_heads=4, num_kv_heads=3, mlp_dim=8, max_seq_len=8
        )


def test_presets_have_the_advertised_sizes():
    small = nnx.eval_shape(lambda: Transformer(preset("small"), rngs=nnx.Rngs(0)))
    assert 10e6 <= count_parameters(small) <= 20e6
    llama, qwen = preset("llama-3.2-1b"), preset("qwen3-0.6b")
    assert (llama.num_kv_heads, llama.head_dim, llama.tie_embeddings) == (8, 64, True)
    assert (qwen.head_dim, qwen.qk_norm, qwen.d_model) == (128, True, 1024)
    with pytest.raises(ValueError, match="unknown model preset"):
        preset("gpt-5")
