"""The sampling math against hand computations and ``jax.random.categorical``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from policy.engine import sample_tokens


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


def test_untruncated_draws_are_those_of_jax_random_categorical():
    # The Gumbel noise is drawn apart from the logits (a chunk draws all its steps' noise up
    # front); the tokens must still be exactly categorical's with the same keys.
    logits = jax.random.normal(jax.random.key(1), (8, 50)) * 3
    temperature = jnp.full(8, 0.7)
    keys = jax.random.split(jax.random.key(2), 8)
    tokens, logprobs = jax.jit(sample_tokens)(
        logits, temperature, jnp.ones(8), jnp.zeros(8, jnp.int32), keys
    )
    expected = jax.vmap(jax.random.categorical)(keys, logits / 0.7)
    assert np.asarray(tokens).tolist() == np.asarray(expected).tolist()
    tempered = jax.nn.log_softmax(logits / 0.7, axis=-1)
    np.testing.assert_allclose(
        np.asarray(logprobs), np.asarray(tempered)[np.arange(8), np.asarray(tokens)], atol=1e-6
    )
