"""Sampling math: one token per row from its logits, with its behaviour log-probability.

The behaviour log-probability recorded for a token is ``log_softmax(logits /
temperature)`` at that token, i.e. under the temperature-scaled distribution
*before* top-k/top-p truncation. The trainer recomputes exactly that (it
divides its logits by the same temperature), so the two are comparable; with
truncation on, the recorded value is not the probability the token was
actually drawn with (which is larger), by design.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def sample_tokens(
    logits: jax.Array,
    temperature: jax.Array,
    top_p: jax.Array,
    top_k: jax.Array,
    keys: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """Draw one token per row; returns (tokens [B], behaviour log-probs [B]).

    Args:
      logits: float32 [B, V].
      temperature: float32 [B], > 0.
      top_p: float32 [B] in (0, 1]; 1 disables nucleus truncation.
      top_k: int32 [B]; 0 disables top-k truncation.
      keys: [B] typed PRNG keys.

    Top-k is applied first, then top-p over the renormalised top-k
    distribution (as in vLLM and Hugging Face). Tokens tied with the
    truncation threshold are all kept. The returned log-prob is under the
    untruncated tempered distribution (module docstring). The draw is
    ``jax.random.categorical(keys[b], truncated logits)``, done as
    :func:`sample_with_noise` with :func:`gumbel_noise` of the keys.
    """
    return sample_with_noise(
        logits, temperature, top_p, top_k, gumbel_noise(keys, logits.shape[-1])
    )


def gumbel_noise(keys: jax.Array, vocab_size: int) -> jax.Array:
    """float32 [..., V]: the Gumbel noise ``jax.random.categorical`` adds for each key of ``keys``.

    Computing it apart from the logits lets a decode chunk draw the noise of
    all its steps at once, before its loop: on CPU, JAX runs the threefry
    hash as a loop of its own, which is costly once per token but cheap once
    per chunk.
    """
    flat = keys.reshape(-1)
    noise = jax.vmap(lambda key: jax.random.gumbel(key, (vocab_size,), jnp.float32))(flat)
    return noise.reshape(*keys.shape, vocab_size)


def sample_with_noise(
    logits: jax.Array,
    temperature: jax.Array,
    top_p: jax.Array,
    top_k: jax.Array,
    noise: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """:func:`sample_tokens` with the keys' Gumbel noise [B, V] (:func:`gumbel_noise`) given.

    ``argmax(truncated logits + noise)`` is exactly the token
    ``jax.random.categorical`` draws with the keys the noise came from.
    """
    scaled = logits / temperature[:, None]
    log_probs = jax.nn.log_softmax(scaled, axis=-1)

    def truncate(scaled: jax.Array) -> jax.Array:
        vocab_size = scaled.shape[-1]
        ranks = jnp.arange(vocab_size, dtype=jnp.int32)[None, :]
        k = jnp.where(top_k > 0, jnp.minimum(top_k, vocab_size), vocab_size)[:, None]
        descending = -jnp.sort(-scaled, axis=-1)
        in_top_k = ranks < k
        top_k_probs = jax.nn.softmax(jnp.where(in_top_k, descending, -jnp.inf), axis=-1)
        mass_before = jnp.cumsum(top_k_probs, axis=-1) - top_k_probs
        # The most likely token always survives, since mass_before is 0 there and top_p > 0.
        keep = in_top_k & (mass_before < top_p[:, None])
        threshold = jnp.min(jnp.where(keep, descending, jnp.inf), axis=-1, keepdims=True)
        return jnp.where(scaled >= threshold, scaled, -jnp.inf)

    # The sort is the costly part; skip it when no row truncates.
    needs_truncation = jnp.any((top_k > 0) | (top_p < 1.0))
    truncated = jax.lax.cond(needs_truncation, truncate, lambda scaled: scaled, scaled)
    tokens = jnp.argmax(truncated + noise, axis=-1).astype(jnp.int32)
    token_log_probs = jnp.take_along_axis(log_probs, tokens[:, None], axis=-1)[:, 0]
    return tokens, token_log_probs
