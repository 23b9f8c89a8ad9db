"""The engine's jitted functions: cache initialisation, prefill and the decode chunk.

They are pure functions of the parameters, the KV cache and host-built index
arrays (:mod:`policy.engine.scheduler` builds them), and they donate the cache
and the stored logits, so a step updates them in place.

Slot layout invariant: row ``r`` of the cache holds, at slots ``0 ..
len(tokens) - 1``, the keys and values of the host-side token list of slot
``r``, with rotary position equal to the slot index. Slots beyond that are
stale and invisible to every query (causality is by slot), and slot
``max_seq_len`` is a scratch slot that idle and finished rows write into
during a chunk. Cache row ``num_slots`` does not exist: rows that index it are
padding, whose reads are clipped and whose writes are dropped.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Hashable
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from policy.engine.sampling import sample_with_uniform, uniform_draws
from policy.model import KVCache, Transformer, TransformerConfig


@dataclasses.dataclass(frozen=True)
class KernelShape:
    """Everything an engine's compiled functions depend on besides their arguments."""

    graphdef: nnx.GraphDef[Transformer]
    config: TransformerConfig
    num_slots: int
    chunk_size: int
    eos_id: int
    pad_id: int
    cache_dtype: Any


class Kernels:
    """The jitted prefill, decode and cache-initialisation functions of one :class:`KernelShape`.

    Engines of the same shape share one instance (:func:`kernels_for`), so a
    new engine, e.g. a worker's runtime for the next run of the same model,
    reuses every compiled bucket instead of tracing and compiling them again
    (about 11 s for a nano model's 21 buckets on two CPU cores, paid mid-run).
    """

    def __init__(self, shape: KernelShape):
        self._graphdef = shape.graphdef
        self._config = shape.config
        self._num_slots = shape.num_slots
        self._chunk_size = shape.chunk_size
        self._eos_id = shape.eos_id
        self._pad_id = shape.pad_id
        self._cache_dtype = shape.cache_dtype
        # One scratch slot past max_seq_len: rows that are not decoding write there.
        self._cache_len = shape.config.max_seq_len + 1
        self.trace_counts: collections.Counter[str] = collections.Counter()
        # What an engine's warm-up compiled already: its buckets with its weights' shapes and dtypes. A
        # later engine's warm-up of the same would only run every compiled bucket once more.
        self.warmed: set[Hashable] = set()
        self.init_state = jax.jit(self._init_state_traced)
        self.prefill = jax.jit(self._prefill_traced, donate_argnums=(1, 2))
        self.decode = jax.jit(self._decode_traced, donate_argnums=(1, 2), static_argnames=("rows",))

    def _init_state_traced(self, params: nnx.State) -> tuple[KVCache, jax.Array]:
        self.trace_counts["init_cache"] += 1
        model = nnx.merge(self._graphdef, params)
        cache = model.init_cache(self._num_slots, self._cache_len, self._cache_dtype)
        return cache, jnp.zeros((self._num_slots, self._config.vocab_size), jnp.float32)

    def _prefill_traced(
        self,
        params: nnx.State,
        cache: KVCache,
        logits: jax.Array,
        rows: jax.Array,
        sources: jax.Array,
        tokens: jax.Array,
        starts: jax.Array,
        last_index: jax.Array,
    ) -> tuple[KVCache, jax.Array]:
        """Write the windows ``tokens`` [n, P] into cache rows ``rows`` at ``starts``.

        Each window attends to the slots before ``starts`` of cache row
        ``sources`` (its own row, or another row holding the same prefix),
        and row ``rows`` gets that prefix with the window after it: a prefix
        shared with another row is copied with the row, never recomputed.
        Rows equal to ``num_slots`` are padding: their reads are clipped and
        their writes dropped. Stores the logits at ``last_index`` (the last
        prompt token) of each row, from which the first new token is sampled.
        """
        self.trace_counts["prefill"] += 1
        model = nnx.merge(self._graphdef, params)
        count, length = tokens.shape
        row_cache = [
            {name: array.at[sources].get(mode="clip") for name, array in layer.items()}
            for layer in cache
        ]
        positions = starts[:, None] + jnp.arange(length, dtype=jnp.int32)[None, :]
        # Right padding and stale slots lie after the real tokens: causality hides them.
        key_mask = jnp.ones((count, self._cache_len), jnp.bool_)
        last_logits, row_cache = model.decode(
            tokens, positions, row_cache, starts, key_mask, logits_at=last_index
        )
        last_logits = last_logits[:, 0]
        cache = [
            {
                name: array.at[rows].set(row_layer[name], mode="drop")
                for name, array in layer.items()
            }
            for layer, row_layer in zip(cache, row_cache, strict=True)
        ]
        return cache, logits.at[rows].set(last_logits, mode="drop")

    def _decode_traced(
        self,
        params: nnx.State,
        cache: KVCache,
        logits: jax.Array,
        indices: jax.Array,
        offsets: jax.Array,
        active: jax.Array,
        budgets: jax.Array,
        counts: jax.Array,
        seeds: jax.Array,
        temperatures: jax.Array,
        top_ps: jax.Array,
        top_ks: jax.Array,
        *,
        rows: int,
    ) -> tuple[KVCache, jax.Array, jax.Array, jax.Array, jax.Array]:
        """Decode up to ``chunk_size`` tokens for the cache rows ``indices`` [rows].

        The rows are gathered from the cache, decoded, and scattered back;
        dummy rows (index ``num_slots``) read a clipped row and their writes
        are dropped. A chunk of every row (``rows == num_slots``, ``indices``
        the identity) decodes the cache in place: no copy of it per chunk,
        which for a large model would cost more than the decode.

        Each step samples every active row from its stored logits, writes the
        token's keys at the row's offset (idle rows write the scratch slot)
        and stores the logits for the next step. A row stops at EOS or when
        its budget is spent; the loop exits early once no row is active.
        Returns (cache, logits, tokens [rows, chunk], log-probs [rows, chunk],
        tokens produced per row).
        """
        self.trace_counts["decode"] += 1
        model = nnx.merge(self._graphdef, params)
        chunk, scratch = self._chunk_size, self._config.max_seq_len
        whole_cache = rows == self._num_slots
        if whole_cache:
            row_cache, row_logits = cache, logits
        else:
            row_cache = [{name: array.at[indices].get(mode="clip") for name, array in layer.items()}
                         for layer in cache]
            row_logits = logits.at[indices].get(mode="clip")
        key_mask = jnp.ones((rows, self._cache_len), jnp.bool_)

        def keep_going(carry):
            step, _, _, _, active, _, _, _ = carry
            return (step < chunk) & jnp.any(active)

        # A row's n-th token is drawn with key fold_in(key(seed), n). Rows only
        # ever stop within a chunk, so an active row's step s draws its token
        # number counts + s, and the random numbers of every step are drawn up front.
        steps = jnp.arange(chunk, dtype=jnp.int32)
        keys = jax.vmap(
            lambda seed, count: jax.vmap(jax.random.fold_in, in_axes=(None, 0))(
                jax.random.key(seed), count + steps
            ),
            out_axes=1,
        )(seeds, counts)  # [chunk, rows]
        uniforms = uniform_draws(keys)

        def decode_step(carry):
            step, row_cache, row_logits, offsets, active, produced, tokens, logprobs = carry
            token, token_logprob = sample_with_uniform(
                row_logits, temperatures, top_ps, top_ks, uniforms[step]
            )
            token = jnp.where(active, token, self._pad_id)
            tokens = tokens.at[:, step].set(token)
            logprobs = logprobs.at[:, step].set(jnp.where(active, token_logprob, 0.0))
            write_at = jnp.where(active, offsets, scratch)
            step_logits, row_cache = model.decode(
                token[:, None], write_at[:, None], row_cache, write_at, key_mask
            )
            produced = produced + active
            offsets = offsets + active
            active = active & (token != self._eos_id) & (produced < budgets)
            return (
                step + 1,
                row_cache,
                step_logits[:, 0],
                offsets,
                active,
                produced,
                tokens,
                logprobs,
            )

        initial = (
            jnp.int32(0),
            row_cache,
            row_logits,
            offsets,
            active & (budgets > 0),
            jnp.zeros(rows, jnp.int32),
            jnp.full((rows, chunk), self._pad_id, jnp.int32),
            jnp.zeros((rows, chunk), jnp.float32),
        )
        _, row_cache, row_logits, _, _, produced, tokens, logprobs = jax.lax.while_loop(
            keep_going, decode_step, initial
        )
        if whole_cache:
            return row_cache, row_logits, tokens, logprobs, produced
        cache = [
            {name: array.at[indices].set(row_layer[name], mode="drop") for name, array in layer.items()}
            for layer, row_layer in zip(cache, row_cache, strict=True)
        ]
        logits = logits.at[indices].set(row_logits, mode="drop")
        return cache, logits, tokens, logprobs, produced


@functools.lru_cache(maxsize=8)
def kernels_for(shape: KernelShape) -> Kernels:
    """The one :class:`Kernels` of ``shape`` in this process."""
    return Kernels(shape)
