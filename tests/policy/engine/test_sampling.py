"""The sampling math against hand computations, a float64 inverse CDF and the frequencies it should give."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from policy.engine import sample_tokens, uniform_draws


def test_top_k_and_top_p_keep_exactly_the_tokens_a_hand_computation_keeps():
    # Probabilities at temperature 1: softmax([0, 1, 2, 3]) = [0.032, 0.087, 0.237, 0.644].
    logits = jnp.tile(jnp.asarray([[0.0, 1.0, 2.0, 3.0]]), (4, 1))
    temperature = jnp.ones(4)
    # Row 0: top-k 2 -> {2, 3}. Row 1: top-p 0.7 -> {3, 2} (0.644 < 0.7). Row 2: top-p 0.6 -> {3}.
    # Row 3: top-k 3, then top-p 0.75 over the renormalised {1, 2, 3} = [0.09, 0.245, 0.665] -> {3, 2}.
    top_p = jnp.asarray([1.0, 0.7, 0.6, 0.75])
    top_k = jnp.asarray([2, 0, 0, 3], jnp.int32)
    draw = jax.jit(jax.vmap(sample_tokens, in_axes=(None, None, None, None, 0)))
    keys = jax.random.split(jax.random.key(0), (2000, 4))
    tokens, logprobs = draw(logits, temperature, top_p, top_k, keys)
    seen = [set(np.asarray(tokens[:, row]).tolist()) for row in range(4)]
    assert seen == [{2, 3}, {2, 3}, {3}, {2, 3}]
    # Behaviour log-probs are those of the untruncated tempered distribution.
    expected = np.asarray(jax.nn.log_softmax(logits[0]))
    np.testing.assert_allclose(np.asarray(logprobs), expected[np.asarray(tokens)], atol=1e-6)


def test_untruncated_draws_are_the_inverse_cdf_of_one_uniform_number_per_key():
    # 1,000 tokens: four blocks of the two-level inverse CDF, the last one partial.
    logits = jax.random.normal(jax.random.key(1), (8, 1000)) * 3
    temperature = jnp.full(8, 0.7)
    keys = jax.random.split(jax.random.key(2), 8)
    tokens, logprobs = jax.jit(sample_tokens)(
        logits, temperature, jnp.ones(8), jnp.zeros(8, jnp.int32), keys
    )
    tempered = np.asarray(logits, np.float64) / 0.7
    probs = np.exp(tempered - tempered.max(axis=-1, keepdims=True))
    cdf = np.cumsum(probs / probs.sum(axis=-1, keepdims=True), axis=-1)
    uniforms = np.asarray(uniform_draws(keys), np.float64)
    expected = [int(np.searchsorted(cdf[row], uniforms[row], side="right")) for row in range(8)]
    assert np.asarray(tokens).tolist() == expected
    log_softmax = np.asarray(jax.nn.log_softmax(logits / 0.7, axis=-1))
    np.testing.assert_allclose(
        np.asarray(logprobs), log_softmax[np.arange(8), np.asarray(tokens)], atol=1e-6
    )


def test_draws_follow_the_distribution_and_never_pick_a_token_of_probability_zero():
    # Mass on five tokens of 600, at both edges of a 256-token block and in the last, partial one.
    support = np.asarray([3, 255, 256, 511, 599])
    probabilities = np.asarray([0.1, 0.2, 0.3, 0.25, 0.15])
    logits = np.full(600, -np.inf, np.float32)
    logits[support] = np.log(probabilities)
    draws = 20_000
    keys = jax.random.split(jax.random.key(3), draws)
    tokens, _ = jax.jit(sample_tokens)(
        jnp.tile(jnp.asarray(logits), (draws, 1)), jnp.ones(draws), jnp.ones(draws),
        jnp.zeros(draws, jnp.int32), keys,
    )
    tokens = np.asarray(tokens)
    assert set(tokens.tolist()) <= set(support.tolist())
    frequencies = np.asarray([(tokens == token).mean() for token in support])
    # Four standard deviations of a frequency over 20,000 draws is at most 0.0142.
    np.testing.assert_allclose(frequencies, probabilities, atol=0.0142)
