"""Continuous-batching inference over a persistent, slot-based KV cache.

A producer runs many agent episodes at once, each alternating between
generating a turn and waiting on its environment. :class:`InferenceEngine`
serves all of them from one KV cache of ``num_slots`` rows (a *slot* is one
row, ``max_seq_len`` tokens long, plus one scratch slot at the end):

- **Continuous batching.** Every active slot advances together in a jitted
  decode *chunk* of ``chunk_size`` tokens. Between chunks, requests that
  finished (EOS, a stop string, ``max_new_tokens``) are returned at once and
  waiting requests are prefilled into free slots, so a turn never waits for
  the other rows of a batch, only for at most one chunk.
- **Holding a chunk for refills.** The turns a chunk ends are usually followed
  soon by their callers' next ones (the episode's next turn, or the next
  episode). With ``refill_hold_fraction`` the background thread holds the
  next chunk until they arrive, for at most that fraction of the last chunk's
  time, and only while recent refills came that soon
  (:mod:`~policy.engine.admission`); ``EngineStats.held_s`` counts the wait.
- **Prefix reuse across turns.** A request names a ``session_id`` (one per
  episode) and keeps its slot between turns. When the next prompt extends the
  tokens already cached in the slot, only the new tokens (the environment's
  observation) are prefilled, at the slot's current offset. More generally
  the longest common prefix is kept, so a prompt that diverges is re-encoded
  from the divergence; a session whose slot was evicted (least recently used,
  when there are more sessions than slots) is prefilled in full. Sessions end
  with :meth:`InferenceEngine.end_session`.
- **Prefix sharing across sessions.** A new prompt may also continue another
  slot's cached tokens: the episodes of one GRPO group share their whole
  prompt, and every episode of an environment its system message and tool
  schemas. The longer prefix's keys and values are copied with the row inside
  the prefill call (no extra pass), and only the rest is prefilled; only
  prefixes computed by the current weights are shared, and only when that
  shrinks the prefill window (``EngineStats.shared_tokens`` counts them).
- **Fixed shapes.** Prefill pads the new tokens to a length bucket and groups
  newcomers into row buckets; a decode chunk gathers the busy slots' rows
  into the smallest row bucket that holds them and scatters them back, so
  its cost follows the turns being generated, not the sessions holding
  slots while they wait on their environments. Everything else (offsets, temperatures,
  top-p, top-k, seeds, budgets) is traced data, so nothing recompiles after
  :meth:`InferenceEngine.warmup`. ``trace_counts`` counts traces.
- **Weights between chunks.** :meth:`InferenceEngine.set_params` stages new
  parameters; they are swapped in at the next chunk boundary, never inside a
  chunk, and in-flight requests keep decoding with them (no drain). Cached
  prefixes are kept across a swap too: a session's next turn attends to keys
  and values the older weights computed. The recorded log-probs are still
  exactly those its tokens were sampled from, and the episode's oldest
  version (its previous turn's) still bounds its staleness.

The engine is split by concern: :mod:`~policy.engine.sampling` (the sampling
math and which log-probability is recorded), :mod:`~policy.engine.scheduler`
(requests, slots, buckets, prefix matching and admission: host bookkeeping,
no JAX), :mod:`~policy.engine.admission` (when to hold a chunk for refills),
:mod:`~policy.engine.kernels` (the jitted prefill and decode chunk,
and the slot layout of the cache) and :mod:`~policy.engine.engine` (the
:class:`InferenceEngine` that drives them, its thread and its weights).
"""

from policy.engine.engine import Completion, EngineStats, InferenceEngine
from policy.engine.sampling import sample_tokens, sample_with_uniform, uniform_draws
from policy.engine.scheduler import SamplingParams

__all__ = [
    "Completion",
    "EngineStats",
    "InferenceEngine",
    "SamplingParams",
    "sample_tokens",
    "sample_with_uniform",
    "uniform_draws",
]
