"""What every loss reads of the policy: per-token log-probs, entropy and argmax hits, without ``[B, T, V]`` logits.

At a vocabulary of 150k to 260k the logits of one batch dwarf the model: 64 episodes of 1,024 tokens
at 262,144 entries are 69 GB in float32. :func:`chunked_token_statistics` never holds them. It runs
the output head over ``chunk_positions`` sequence positions of every row at a time, reduces each
chunk to three numbers per token, and is rematerialised (``jax.checkpoint``), so the backward pass
recomputes one chunk's logits at a time instead of keeping them all. Chunks run along the sequence
only, so the batch axis keeps its sharding over the mesh.

:func:`logits_token_statistics` computes the same from full logits: the reference the chunked path
is tested against, and what callers that already hold logits use.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import flax.struct
import jax
import jax.numpy as jnp

__all__ = ["TokenStatistics", "chunked_token_statistics", "logits_token_statistics", "policy_token_statistics"]


@flax.struct.dataclass
class TokenStatistics:
    """Per predicted token, all float32 ``[B, T - 1]``: slot ``t`` is about the token at slot ``t + 1``
    (the losses' shift convention), under the temperature-scaled next-token distribution."""

    # log p(token) under the distribution at the slot before it; differentiable.
    logprobs: jax.Array
    # Entropy of that distribution (a metric: the losses never differentiate it).
    entropy: jax.Array
    # 1 where the distribution's most likely token is the one that came, else 0 (SFT's token accuracy).
    argmax_hits: jax.Array


def _statistics(logits: jax.Array, targets: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(log-probs of ``targets``, entropy, argmax hits) of float32 ``logits`` [..., V]."""
    log_normaliser = jax.nn.logsumexp(logits, axis=-1)
    target_logits = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    probabilities = jnp.exp(logits - log_normaliser[..., None])
    entropy = log_normaliser - jnp.sum(probabilities * logits, axis=-1)
    hits = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
    return target_logits - log_normaliser, jax.lax.stop_gradient(entropy), hits


def logits_token_statistics(logits: jax.Array, tokens: jax.Array, *, temperature: float = 1.0) -> TokenStatistics:
    """The statistics of full ``logits`` [B, T, V] of ``tokens`` [B, T] (unchunked)."""
    logprobs, entropy, hits = _statistics(logits[:, :-1].astype(jnp.float32) / temperature, tokens[:, 1:])
    return TokenStatistics(logprobs=logprobs, entropy=entropy, argmax_hits=hits)


def chunked_token_statistics(
    hidden: jax.Array,
    head: Callable[[jax.Array], jax.Array],
    tokens: jax.Array,
    *,
    temperature: float = 1.0,
    chunk_positions: int,
) -> TokenStatistics:
    """The statistics of ``head(hidden)`` without its full logits.

    Args:
      hidden: float32 [B, T, D], the final-normed hidden states (``Transformer.hidden_states``).
      head: hidden [..., D] -> float32 logits [..., V] (``Transformer.logits``).
      tokens: int32 [B, T], the sequences ``hidden`` was computed from.
      temperature: the logits are divided by it (the producers' sampling temperature).
      chunk_positions: sequence positions of every row whose logits exist at once; the last chunk
        is padded (its padding is computed and dropped).
    """
    predicting, targets = hidden[:, :-1], tokens[:, 1:]
    rows, length = targets.shape
    size = max(1, min(chunk_positions, length))
    chunks = math.ceil(length / size)
    padding = chunks * size - length
    predicting = jnp.pad(predicting, ((0, 0), (0, padding), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, padding)))
    # [chunks, B, size, ...]: the map runs over the leading axis, the batch axis stays where it was.
    predicting = predicting.reshape(rows, chunks, size, -1).swapaxes(0, 1)
    targets = targets.reshape(rows, chunks, size).swapaxes(0, 1)

    @jax.checkpoint
    def one_chunk(chunk: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array, jax.Array]:
        chunk_hidden, chunk_targets = chunk
        return _statistics(head(chunk_hidden).astype(jnp.float32) / temperature, chunk_targets)

    per_chunk = jax.lax.map(one_chunk, (predicting, targets))
    logprobs, entropy, hits = (values.swapaxes(0, 1).reshape(rows, chunks * size)[:, :length]
                               for values in per_chunk)
    return TokenStatistics(logprobs=logprobs, entropy=entropy, argmax_hits=hits)


def policy_token_statistics(
    model, batch, *, temperature: float = 1.0, chunk_tokens: int, remat: str = "none",
    query_chunk: int | None = None,
) -> tuple[TokenStatistics, jax.Array]:
    """The token statistics of ``batch`` under ``model`` (a policy with ``hidden_states`` and ``logits``,
    such as ``policy.Transformer`` or a ``PolicyWithValue``), and its hidden states [B, T, D] (a value
    head's input). ``chunk_tokens``: tokens of the batch whose logits exist at once (at least one
    position of every row); ``remat``: what the backward pass keeps of each block (policy.REMAT_POLICIES);
    ``query_chunk``: queries of a longer row attended at once (None: whole rows)."""
    hidden = model.hidden_states(batch.tokens, batch.positions, batch.attention_mask, remat=remat,
                                 query_chunk=query_chunk)
    rows = batch.tokens.shape[0]
    statistics = chunked_token_statistics(hidden, model.logits, batch.tokens, temperature=temperature,
                                          chunk_positions=max(1, chunk_tokens // rows))
    return statistics, hidden
