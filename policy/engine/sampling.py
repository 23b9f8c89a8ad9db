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
    untruncated tempered distribution (module docstring). The draw is the
    inverse CDF of the truncated distribution at one uniform number per key
    (:func:`uniform_draws`, :func:`sample_with_uniform`).
    """
    return sample_with_uniform(logits, temperature, top_p, top_k, uniform_draws(keys))


def uniform_draws(keys: jax.Array) -> jax.Array:
    """float32 [...]: one uniform number in [0, 1) per key of ``keys``.

    One number per token, not one per vocabulary entry as Gumbel-max
    sampling needs: on CPU, JAX runs the threefry hash as a loop of its own,
    and hashing 49,152 numbers per token of a real vocabulary cost about
    16 ms of a 16-row decode step of SmolLM2-135M.
    """
    flat = keys.reshape(-1)
    return jax.vmap(lambda key: jax.random.uniform(key, (), jnp.float32))(flat).reshape(keys.shape)


# Tokens per block of the two-level inverse CDF; a cumulative sum over a whole
# 49,152-token vocabulary is several times slower on CPU than two short ones.
_CDF_BLOCK = 256


def _inverse_cdf(probs: jax.Array, uniform: jax.Array) -> jax.Array:
    """int32 [B]: the token whose CDF interval holds ``uniform`` [B] of ``probs`` [B, V].

    Two levels: the block whose cumulative mass holds the target, then the
    token inside that block. A token of probability 0 has an empty interval
    and is never drawn; float rounding that puts the target past the last
    cumulative value falls back to the last token of positive probability.
    """
    rows, vocab_size = probs.shape
    blocks = -(-vocab_size // _CDF_BLOCK)
    padded = jnp.pad(probs, ((0, 0), (0, blocks * _CDF_BLOCK - vocab_size)))
    by_block = padded.reshape(rows, blocks, _CDF_BLOCK)
    block_mass = by_block.sum(axis=-1)
    block_cdf = jnp.cumsum(block_mass, axis=-1)
    target = uniform * block_cdf[:, -1]

    def last_positive(mass: jax.Array) -> jax.Array:
        return jnp.max(jnp.where(mass > 0, jnp.arange(mass.shape[-1]), 0), axis=-1)

    block = jnp.minimum(jnp.sum(block_cdf <= target[:, None], axis=-1), last_positive(block_mass))
    inside = jnp.take_along_axis(by_block, block[:, None, None], axis=1)[:, 0]  # [B, block]
    mass_before = jnp.take_along_axis(block_cdf - block_mass, block[:, None], axis=1)
    inside_cdf = mass_before + jnp.cumsum(inside, axis=-1)
    offset = jnp.minimum(jnp.sum(inside_cdf <= target[:, None], axis=-1), last_positive(inside))
    return (block * _CDF_BLOCK + offset).astype(jnp.int32)


def sample_with_uniform(
    logits: jax.Array,
    temperature: jax.Array,
    top_p: jax.Array,
    top_k: jax.Array,
    uniform: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """:func:`sample_tokens` with the keys' uniform numbers [B] (:func:`uniform_draws`) given."""
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
    tokens = _inverse_cdf(jax.nn.softmax(truncated, axis=-1), uniform)
    token_log_probs = jnp.take_along_axis(log_probs, tokens[:, None], axis=-1)[:, 0]
    return tokens, token_log_probs
