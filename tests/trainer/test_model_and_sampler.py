"""The transformer's cached decode and the sampler, against full forward passes.

Logit comparisons use an absolute tolerance of 1e-4 (float32, different
summation orders between the cached and the full path).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from tandem.run_config import ModelConfig
from trainer.model import Transformer, TransformerConfig, count_parameters, split_model
from trainer.sampler import Completion, Sampler
from trainer.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE

TOLERANCE = 1e-4

CONFIG = TransformerConfig(
    vocab_size=VOCAB_SIZE, d_model=32, num_layers=2, num_heads=2, mlp_dim=64, max_seq_len=64
)


@pytest.fixture(scope="module")
def model() -> Transformer:
    return Transformer(CONFIG, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def sampler_and_params(model) -> tuple[Sampler, nnx.State]:
    graphdef, params = split_model(model)
    return Sampler(graphdef, config=CONFIG, eos_id=EOS_ID, pad_id=PAD_ID), params


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


@pytest.fixture(scope="module")
def forward_logprobs(model):
    """Tempered log-probs of sequence[1:] from a full forward pass, right-padded as in training.

    Jitted at one padded length, so all recomputations share one compilation.
    """
    graphdef, params = split_model(model)

    @jax.jit
    def tempered_logprobs(params, tokens, mask, temperature):
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
        logits = nnx.merge(graphdef, params)(tokens, positions, mask)[:, :-1]
        log_probs = jax.nn.log_softmax(logits / temperature, axis=-1)
        return jnp.take_along_axis(log_probs, tokens[:, 1:, None], axis=-1)[..., 0]

    def compute(sequence: list[int], temperature: float) -> np.ndarray:
        tokens = np.full((1, CONFIG.max_seq_len), PAD_ID, np.int32)
        tokens[0, : len(sequence)] = sequence
        mask = np.arange(CONFIG.max_seq_len)[None] < len(sequence)
        log_probs = tempered_logprobs(params, tokens, mask, np.float32(temperature))
        return np.asarray(log_probs)[0, : len(sequence) - 1]

    return compute


def test_config_comes_from_the_run_config():
    config = TransformerConfig.from_model_config(ModelConfig(), vocab_size=VOCAB_SIZE)
    assert (config.d_model, config.num_heads, config.vocab_size) == (64, 4, VOCAB_SIZE)
    with pytest.raises(ValueError, match="num_heads"):
        TransformerConfig(
            VOCAB_SIZE, d_model=30, num_layers=1, num_heads=4, mlp_dim=8, max_seq_len=16
        )


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


def test_returned_logprobs_match_a_full_forward_pass_of_the_completion(
    forward_logprobs, sampler_and_params
):
    sampler, params = sampler_and_params
    temperature = 0.7
    prompts = [_random_tokens(5, 9), _random_tokens(6, 3), _random_tokens(7, 20)]

    completions = sampler.generate(
        params, prompts, max_new_tokens=12, temperature=temperature, seed=0
    )

    assert len(completions) == len(prompts)
    for prompt, completion in zip(prompts, completions, strict=True):
        assert isinstance(completion, Completion)
        assert len(completion.token_ids) == len(completion.logprobs)
        assert completion.finished == (EOS_ID in completion.token_ids)
        if not completion.finished:
            assert len(completion.token_ids) == 12
        recomputed = forward_logprobs(prompt + completion.token_ids, temperature)
        np.testing.assert_allclose(
            completion.logprobs, recomputed[len(prompt) - 1 :], atol=TOLERANCE
        )


def test_a_row_does_not_depend_on_the_other_prompts_in_its_batch(
    forward_logprobs, sampler_and_params
):
    sampler, params = sampler_and_params
    prompt = _random_tokens(8, 6)
    alone = sampler.generate(params, [prompt], max_new_tokens=10, temperature=1e-4, seed=3)[0]
    crowded = sampler.generate(
        params,
        [_random_tokens(9, 30), prompt, _random_tokens(10, 2)],
        max_new_tokens=10,
        temperature=1e-4,
        seed=4,
    )[1]
    # Near-greedy sampling: the same prompt yields the same tokens, whatever its padding.
    assert crowded.token_ids == alone.token_ids
    # And at a normal temperature, a row in a padded batch still reports its own log-probs.
    sampled = sampler.generate(
        params, [_random_tokens(11, 25), prompt], max_new_tokens=10, temperature=1.0, seed=5
    )[1]
    np.testing.assert_allclose(
        sampled.logprobs,
        forward_logprobs(prompt + sampled.token_ids, 1.0)[len(prompt) - 1 :],
        atol=TOLERANCE,
    )


def test_generation_stops_at_eos_and_keeps_it(model):
    graphdef, params = split_model(model)
    prompts = [_random_tokens(12, 4), _random_tokens(13, 7)]
    probe = Sampler(graphdef, config=CONFIG, eos_id=-1, pad_id=PAD_ID)
    greedy = probe.generate(params, prompts, max_new_tokens=16, temperature=1e-4, seed=0)

    # Declare the first token that row 0 generates for the first time at step >= 1 the EOS,
    # so that row 0 must stop exactly there (at step 0 if it only ever repeats one token).
    first_tokens = greedy[0].token_ids
    stop = next((i for i in range(1, 16) if first_tokens[i] not in first_tokens[:i]), 0)
    eos_id = first_tokens[stop]
    sampler = Sampler(graphdef, config=CONFIG, eos_id=eos_id, pad_id=PAD_ID)
    completions = sampler.generate(params, prompts, max_new_tokens=16, temperature=1e-4, seed=0)

    assert completions[0].token_ids == first_tokens[: stop + 1]
    assert completions[0].finished
    assert len(completions[0].logprobs) == stop + 1
    # The other row runs on by itself, and stops at the same token if it ever produces it.
    other = greedy[1].token_ids
    expected = other[: other.index(eos_id) + 1] if eos_id in other else other
    assert completions[1].token_ids == expected
    assert completions[1].finished == (eos_id in other)


def test_no_recompilation_within_buckets(sampler_and_params):
    sampler, params = sampler_and_params
    # Warm up the (batch 4, prompt 32, new tokens 8) bucket.
    sampler.generate(
        params, [_random_tokens(14, 10)] * 3, max_new_tokens=5, temperature=1.0, seed=0
    )
    warm = sampler.compile_count

    sampler.generate(
        params,
        [_random_tokens(15, 20), _random_tokens(16, 1), _random_tokens(17, 32), [BOS_ID]],
        max_new_tokens=8,
        temperature=0.3,
        seed=1,
    )
    sampler.generate(
        params, [_random_tokens(18, 31)] * 3, max_new_tokens=6, temperature=2.0, seed=2
    )
    assert sampler.compile_count == warm

    # A new bucket does compile, so the counter is live.
    sampler.generate(
        params, [_random_tokens(19, 10)] * 5, max_new_tokens=5, temperature=1.0, seed=0
    )
    assert sampler.compile_count == warm + 1


def test_new_weights_do_not_recompile(model, sampler_and_params):
    sampler, params = sampler_and_params
    prompts = [_random_tokens(20, 5)]
    sampler.generate(params, prompts, max_new_tokens=4, temperature=1.0, seed=0)
    warm = sampler.compile_count
    scaled = jax.tree.map(lambda leaf: leaf * 1.01, params)
    sampler.generate(scaled, prompts, max_new_tokens=4, temperature=1.0, seed=0)
    assert sampler.compile_count == warm


def test_prompts_that_do_not_fit_are_refused(sampler_and_params):
    sampler, params = sampler_and_params
    with pytest.raises(ValueError, match="max_seq_len=64"):
        sampler.generate(
            params, [_random_tokens(21, 60)], max_new_tokens=5, temperature=1.0, seed=0
        )
    with pytest.raises(ValueError, match="empty"):
        sampler.generate(params, [[]], max_new_tokens=5, temperature=1.0, seed=0)
