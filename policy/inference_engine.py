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
- **Prefix reuse across turns.** A request names a ``session_id`` (one per
  episode) and keeps its slot between turns. When the next prompt extends the
  tokens already cached in the slot, only the new tokens (the environment's
  observation) are prefilled, at the slot's current offset. More generally
  the longest common prefix is kept, so a prompt that diverges is re-encoded
  from the divergence; a session whose slot was evicted (least recently used,
  when there are more sessions than slots) is prefilled in full. Sessions end
  with :meth:`InferenceEngine.end_session`.
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

Sampling and log-probabilities: the behaviour log-probability recorded for a
token is ``log_softmax(logits / temperature)`` at that token, i.e. under the
temperature-scaled distribution *before* top-k/top-p truncation. The trainer
recomputes exactly that (it divides its logits by the same temperature), so
the two are comparable; with truncation on, the recorded value is not the
probability the token was actually drawn with (which is larger), by design.

Slot layout invariant: row ``r`` holds, at slots ``0 .. len(tokens) - 1``, the
keys and values of the host-side token list of its slot, with rotary position
equal to the slot index. Slots beyond that are stale and invisible to every
query (causality is by slot), and slot ``max_seq_len`` is a scratch slot that
idle and finished rows write into during a chunk.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import concurrent.futures
import dataclasses
import functools
import logging
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from policy.model import KVCache, Transformer, TransformerConfig

logger = logging.getLogger(__name__)

StopReason = Literal["eos", "stop", "length"]

# Shortest prefill length bucket; observations between turns are short.
_MIN_PREFILL_BUCKET = 16


@dataclasses.dataclass(frozen=True)
class Completion:
    """One generated turn.

    ``token_ids`` ends with EOS when ``stop_reason == "eos"``, right after the
    first occurrence of a stop string when ``"stop"`` (the stop text is kept),
    and has ``max_new_tokens`` tokens when ``"length"``. ``finished`` is True
    unless the turn was cut off by ``max_new_tokens``.

    ``logprobs[i]`` is the behaviour log-probability of ``token_ids[i]`` under
    the temperature-scaled distribution, before top-k/top-p truncation (see
    the module docstring).

    ``policy_version`` is the version of the weights that generated the first
    token of the turn. Weights only change between decode chunks and versions
    only grow, so it is also the oldest version that generated any token of
    the turn; ``last_policy_version`` is the version of the last token (equal
    unless a weight update landed mid-turn).
    """

    token_ids: list[int]
    logprobs: list[float]
    finished: bool
    stop_reason: StopReason = "length"
    policy_version: int = 0
    last_policy_version: int = 0


@dataclasses.dataclass(frozen=True)
class EngineStats:
    """Counters since the engine was built (a snapshot)."""

    # Prompt tokens run through prefill (new tokens plus any re-encoded overlap).
    prefill_tokens: int
    # Prompt tokens served from a slot's cached prefix instead.
    reused_tokens: int
    # Tokens returned to callers (after stop-string truncation).
    generated_tokens: int
    prefill_calls: int
    decode_chunks: int
    # Rows the decode chunks computed, padding rows included: the busy slots of each chunk,
    # rounded up to a row bucket.
    decode_rows: int
    # Idle sessions whose slot was taken by another session.
    evictions: int
    # Seconds spent inside steps that had work (prefill, decode, bookkeeping).
    busy_s: float


@dataclasses.dataclass
class _Request:
    session_id: Hashable | None
    prompt: list[int]
    max_new_tokens: int
    temperature: float
    top_p: float
    top_k: int
    stop: tuple[str, ...]
    seed: int
    future: concurrent.futures.Future
    token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    first_version: int | None = None
    last_version: int = 0
    # Generated tokens already known to contain no stop string.
    stop_checked: int = 0
    # Its caller went away: drop it at the next chunk boundary.
    abandoned: bool = False


@dataclasses.dataclass
class _Slot:
    index: int
    session_id: Hashable | None = None
    # Tokens whose keys and values sit at slots 0 .. len(tokens) - 1 of this row.
    tokens: list[int] = dataclasses.field(default_factory=list)
    request: _Request | None = None
    last_used: int = 0
    release_when_done: bool = False


def _bucket(size: int, buckets: Sequence[int]) -> int:
    """Smallest bucket >= size; callers have checked that one exists."""
    return buckets[bisect.bisect_left(buckets, size)]


def _default_prefill_buckets(max_seq_len: int) -> tuple[int, ...]:
    buckets, size = [], _MIN_PREFILL_BUCKET
    while size < max_seq_len:
        buckets.append(size)
        size *= 2
    return (*buckets, max_seq_len)


def _default_row_buckets(num_slots: int) -> tuple[int, ...]:
    """Powers of four up to ``num_slots``: few compilations, at most 4x padding."""
    buckets, size = [], 1
    while size < num_slots:
        buckets.append(size)
        size *= 4
    return (*buckets, num_slots)


def _common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    length = min(len(a), len(b))
    for index in range(length):
        if a[index] != b[index]:
            return index
    return length


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


class InferenceEngine:
    """Slot-based continuous batching for one policy; see the module docstring.

    Thread model: with ``background=True`` (the default) a daemon thread runs
    :meth:`step` whenever there is work and exits after ``idle_exit_s`` idle
    seconds (it restarts on the next request, so a dropped engine is freed).
    JAX releases the GIL while a chunk runs, so event loops in other threads
    keep going. With ``background=False`` the caller drives :meth:`step` (or
    :meth:`run_until`) itself, which is deterministic and used by the batch
    :class:`policy.sampler.Sampler`. All public methods are thread-safe.

    Args:
      graphdef: the static half of :func:`policy.model.split_model`.
      config: the policy's shape; ``max_seq_len`` is the length of a slot.
      eos_id, pad_id: special token ids (``eos_id`` ends a turn and is kept).
      num_slots: rows of the KV cache, i.e. requests decoded together; sessions
        beyond it are evicted least-recently-used first.
      chunk_size: tokens every active row decodes between two scheduling
        points; small, so newcomers join quickly and finished rows leave
        quickly, large enough to amortise the host round trip.
      prefill_buckets: padded lengths of prefilled tokens (capped at max_seq_len).
      row_buckets: row counts prefill groups and decode chunks are padded to.
      detokenize: token ids -> text, needed for stop strings.
      between_chunks: called in the engine thread before each step (e.g. to
        poll for new weights and call :meth:`set_params`); errors are logged.
      reuse_prefix: False re-encodes every prompt in full (for comparisons).
      cache_dtype: dtype of the KV cache.
    """

    def __init__(
        self,
        graphdef: nnx.GraphDef[Transformer],
        *,
        config: TransformerConfig,
        eos_id: int,
        pad_id: int,
        num_slots: int = 64,
        chunk_size: int = 8,
        prefill_buckets: Sequence[int] | None = None,
        row_buckets: Sequence[int] | None = None,
        detokenize: Callable[[list[int]], str] | None = None,
        between_chunks: Callable[[], None] | None = None,
        reuse_prefix: bool = True,
        background: bool = True,
        idle_exit_s: float = 10.0,
        cache_dtype: Any = jnp.float32,
    ):
        if num_slots < 1 or chunk_size < 1:
            raise ValueError("num_slots and chunk_size must be at least 1")
        self._config = config
        self._eos_id = eos_id
        self._pad_id = pad_id
        self._num_slots = num_slots
        max_seq_len = config.max_seq_len
        # One scratch slot past max_seq_len: rows that are not decoding write there.
        self._cache_len = max_seq_len + 1
        prefill_buckets = prefill_buckets or _default_prefill_buckets(max_seq_len)
        row_buckets = row_buckets or _default_row_buckets(num_slots)
        # The largest bucket is always the whole slot (or all slots), so every size fits one.
        self._prefill_buckets = tuple(
            sorted({min(b, max_seq_len) for b in prefill_buckets} | {max_seq_len})
        )
        self._row_buckets = tuple(sorted({min(b, num_slots) for b in row_buckets} | {num_slots}))
        self._detokenize = detokenize
        self._between_chunks = between_chunks
        self._reuse_prefix = reuse_prefix
        self._background = background
        self._idle_exit_s = idle_exit_s

        # Host state, guarded by _lock. Steps are serialised by _step_lock and
        # take _lock only for bookkeeping, never while a chunk runs.
        self._lock = threading.Condition()
        self._step_lock = threading.Lock()
        self._slots = [_Slot(index) for index in range(num_slots)]
        self._sessions: dict[Hashable, _Slot] = {}
        self._busy_sessions: set[Hashable] = set()
        self._queue: collections.deque[_Request] = collections.deque()
        self._pending_params: tuple[nnx.State, int] | None = None
        self._has_params = False
        self._clock = 0
        self._thread: threading.Thread | None = None
        self._closed = False
        self._counters = collections.Counter()
        self._busy_s = 0.0

        # Device state, touched only inside steps.
        self._params: nnx.State | None = None
        self._version = 0
        self._cache: KVCache | None = None
        self._logits: jax.Array | None = None

        self._kernels = _kernels_for(_KernelShape(
            graphdef=graphdef, config=config, num_slots=num_slots, chunk_size=chunk_size,
            eos_id=eos_id, pad_id=pad_id, cache_dtype=cache_dtype,
        ))

    # ------------------------------------------------------------------ public API

    @property
    def num_slots(self) -> int:
        return self._num_slots

    @property
    def policy_version(self) -> int:
        """Version of the weights the next chunk will run with (staged ones included)."""
        with self._lock:
            return self._pending_params[1] if self._pending_params else self._version

    @property
    def session_count(self) -> int:
        """Sessions holding a slot (with a cached prefix or a request in flight)."""
        with self._lock:
            return len(self._sessions)

    def cached_length(self, session_id: Hashable) -> int:
        """Tokens of the session whose keys and values are in its slot (0 if it has none)."""
        with self._lock:
            slot = self._sessions.get(session_id)
            return 0 if slot is None else len(slot.tokens)

    @property
    def trace_counts(self) -> dict[str, int]:
        """How often each jitted function was traced: once per shape bucket.

        The functions are shared by every engine of the same shape in this
        process, and so are the counts: an engine built after another of its
        shape has warmed up traces nothing.
        """
        return dict(self._kernels.trace_counts)

    @property
    def trace_count(self) -> int:
        return sum(self._kernels.trace_counts.values())

    @property
    def stats(self) -> EngineStats:
        with self._lock:
            return EngineStats(
                prefill_tokens=self._counters["prefill_tokens"],
                reused_tokens=self._counters["reused_tokens"],
                generated_tokens=self._counters["generated_tokens"],
                prefill_calls=self._counters["prefill_calls"],
                decode_chunks=self._counters["decode_chunks"],
                decode_rows=self._counters["decode_rows"],
                evictions=self._counters["evictions"],
                busy_s=self._busy_s,
            )

    def set_params(self, params: nnx.State, version: int) -> None:
        """Stage new weights; the next chunk (and every later one) runs with them.

        In-flight requests are not drained: they continue with the new weights
        from the next chunk boundary, and their completion reports both the
        version of their first and of their last token.
        """
        with self._lock:
            self._pending_params = (params, int(version))
            self._has_params = True
            self._lock.notify_all()

    def submit(
        self,
        session_id: Hashable | None,
        prompt_tokens: Sequence[int],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        stop: Sequence[str] = (),
        seed: int = 0,
    ) -> concurrent.futures.Future:
        """Queue one turn; the future resolves to a :class:`Completion`.

        ``session_id`` None is a one-off request whose slot is freed at once.
        A session may have one request in flight at a time. The completion
        depends only on the prompt, the sampling arguments, ``seed`` and the
        weights, not on what else is being decoded (up to float rounding of
        differently shaped batches).

        Raises:
          ValueError: the prompt is empty or does not fit with max_new_tokens,
            a sampling argument is out of range, or the session is busy.
          RuntimeError: no weights were set yet, or the engine is closed.
        """
        prompt = [int(token) for token in prompt_tokens]
        max_seq_len = self._config.max_seq_len
        if not prompt:
            raise ValueError("the prompt is empty; it needs at least one token (e.g. BOS)")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if len(prompt) + max_new_tokens > max_seq_len:
            raise ValueError(
                f"the prompt has {len(prompt)} tokens; with max_new_tokens={max_new_tokens} "
                f"it exceeds the model's max_seq_len={max_seq_len}"
            )
        if not temperature > 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {top_k}")
        stop = tuple(stop)
        if any(not text for text in stop):
            raise ValueError("stop strings must not be empty")
        if stop and self._detokenize is None:
            raise ValueError("stop strings need an engine built with detokenize=")
        request = _Request(
            session_id=session_id,
            prompt=prompt,
            max_new_tokens=int(max_new_tokens),
            temperature=float(temperature),
            top_p=float(top_p),
            top_k=int(top_k),
            stop=stop,
            seed=int(seed) & 0x7FFFFFFF,
            future=concurrent.futures.Future(),
        )
        with self._lock:
            if self._closed:
                raise RuntimeError("the inference engine is closed")
            if not self._has_params:
                raise RuntimeError("no weights yet: call set_params before generating")
            if session_id is not None:
                if session_id in self._busy_sessions:
                    raise ValueError(f"session {session_id!r} already has a request in flight")
                self._busy_sessions.add(session_id)
            self._queue.append(request)
            if self._background and self._thread is None:
                self._thread = threading.Thread(
                    target=self._serve, name="inference-engine", daemon=True
                )
                self._thread.start()
            self._lock.notify_all()
        return request.future

    async def generate(
        self,
        session_id: Hashable | None,
        prompt_tokens: Sequence[int],
        *,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        stop: Sequence[str] = (),
        seed: int = 0,
    ) -> Completion:
        """:meth:`submit`, awaited from an event loop (needs ``background=True``).

        Cancelling the awaiting task also stops the turn in the engine, at the
        next chunk boundary (the session keeps the tokens decoded so far).
        """
        future = self.submit(
            session_id,
            prompt_tokens,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            stop=stop,
            seed=seed,
        )
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            self._abandon(future)
            raise

    def _abandon(self, future: concurrent.futures.Future) -> None:
        # A queued request was cancelled with the asyncio future; a running one
        # cannot be, so it is flagged and dropped after the current chunk.
        with self._lock:
            for slot in self._slots:
                request = slot.request
                if request is not None and request.future is future:
                    request.abandoned = True
                    # The session may queue its next turn now; it starts once the slot is free.
                    self._busy_sessions.discard(request.session_id)

    def end_session(self, session_id: Hashable) -> None:
        """Free the session's slot (after its in-flight request, if any). Idempotent."""
        with self._lock:
            slot = self._sessions.pop(session_id, None)
            if slot is None:
                return
            if slot.request is None:
                slot.session_id, slot.tokens = None, []
            else:
                slot.release_when_done = True

    def close(self) -> None:
        """Stop the background thread; queued and running requests are cancelled."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self._step_lock, self._lock:
            error = RuntimeError("the inference engine was closed")
            for request in self._queue:
                request.future.cancel()
            self._queue.clear()
            for slot in self._slots:
                if slot.request is not None:
                    slot.request.future.set_exception(error)
                    slot.request = None
            self._busy_sessions.clear()

    def warmup(self) -> None:
        """Compile every prefill and decode bucket now, with all rows idle.

        Needs weights (:meth:`set_params`). Cached sessions are not disturbed:
        idle rows only write their scratch slot, and dummy prefill rows are
        dropped.
        """
        with self._step_lock:
            with self._lock:
                self._apply_pending_params()
            if self._params is None:
                raise RuntimeError("no weights yet: call set_params before warmup")
            for length in self._prefill_buckets:
                for rows in self._row_buckets:
                    self._cache, self._logits = self._kernels.prefill(
                        self._params,
                        self._cache,
                        self._logits,
                        np.full(rows, self._num_slots, np.int32),
                        np.full((rows, length), self._pad_id, np.int32),
                        np.zeros(rows, np.int32),
                        np.zeros(rows, np.int32),
                    )
            for rows in self._row_buckets:
                _, idle = self._chunk_inputs([], rows)
                outputs = self._kernels.decode(
                    self._params, self._cache, self._logits, *idle, rows=rows
                )
                self._cache, self._logits = outputs[0], outputs[1]
            jax.block_until_ready(self._cache)

    def step(self) -> bool:
        """Run one scheduling round: swap weights, admit and prefill, decode one chunk.

        Returns False when there was nothing to do. Exceptions from the device
        fail the requests that were running (their futures get the exception),
        reset the cache, and propagate.
        """
        with self._step_lock:
            if self._between_chunks is not None:
                try:
                    self._between_chunks()
                except Exception:  # noqa: BLE001 - stale weights beat a stalled producer
                    logger.exception("between_chunks hook failed; decoding on")
            started = time.perf_counter()
            with self._lock:
                self._apply_pending_params()
                admitted = self._admit()
                running = [slot for slot in self._slots if slot.request is not None]
            if not running:
                return False
            try:
                if admitted:
                    self._prefill(admitted)
                finished = self._decode_chunk(running)
            except BaseException as exc:
                self._fail_running(running, exc)
                raise
            for request, outcome in finished:
                if isinstance(outcome, Completion):
                    request.future.set_result(outcome)
                else:
                    request.future.set_exception(outcome)
            with self._lock:
                self._busy_s += time.perf_counter() - started
            return True

    def run_until(self, futures: Sequence[concurrent.futures.Future]) -> None:
        """Step in the calling thread until every future is done (``background=False``)."""
        while not all(future.done() for future in futures):
            if not self.step():
                raise RuntimeError("the engine is idle but some requests never finished")

    # ------------------------------------------------------------------ scheduling

    def _serve(self) -> None:
        while True:
            with self._lock:
                idle_since = time.monotonic()
                while not self._closed and not self._has_work():
                    remaining = self._idle_exit_s - (time.monotonic() - idle_since)
                    if remaining <= 0:
                        self._thread = None
                        return
                    self._lock.wait(timeout=remaining)
                if self._closed:
                    self._thread = None
                    return
            try:
                worked = self.step()
            except Exception:  # noqa: BLE001 - the failed requests carry the exception
                logger.exception("inference engine step failed")
                worked = True
            if not worked:
                with self._lock:
                    self._lock.wait(timeout=0.01)

    def _has_work(self) -> bool:
        return bool(self._queue) or any(slot.request is not None for slot in self._slots)

    def _apply_pending_params(self) -> None:
        if self._pending_params is None:
            return
        self._params, self._version = self._pending_params
        self._pending_params = None
        if self._cache is None:
            self._cache, self._logits = self._kernels.init_state(self._params)

    def _admit(self) -> list[tuple[_Slot, int]]:
        """Move queued requests into slots (FIFO); returns (slot, reused prefix length)."""
        admitted = []
        waiting: collections.deque[_Request] = collections.deque()
        while self._queue:
            request = self._queue.popleft()
            if request.future.cancelled():
                self._busy_sessions.discard(request.session_id)
                continue
            slot = self._slot_for(request.session_id)
            if slot is None:
                waiting.append(request)
                continue
            if not request.future.set_running_or_notify_cancel():
                self._busy_sessions.discard(request.session_id)
                continue
            reused = 0
            if self._reuse_prefix:
                # At least one token is always prefilled: its logits seed the first sample.
                reused = min(
                    _common_prefix_length(slot.tokens, request.prompt), len(request.prompt) - 1
                )
            self._clock += 1
            slot.request, slot.last_used = request, self._clock
            slot.session_id = request.session_id
            if request.session_id is not None:
                self._sessions[request.session_id] = slot
            admitted.append((slot, reused))
        self._queue = waiting
        return admitted

    def _slot_for(self, session_id: Hashable | None) -> _Slot | None:
        if session_id is not None and session_id in self._sessions:
            slot = self._sessions[session_id]
            return slot if slot.request is None else None
        free = [s for s in self._slots if s.request is None and s.session_id is None]
        if free:
            return free[0]
        idle = [s for s in self._slots if s.request is None]
        if not idle:
            return None
        victim = min(idle, key=lambda s: s.last_used)
        del self._sessions[victim.session_id]
        victim.session_id, victim.tokens = None, []
        self._counters["evictions"] += 1
        return victim

    def _fail_running(self, running: list[_Slot], exc: BaseException) -> None:
        with self._lock:
            for slot in running:
                request = slot.request
                if request is not None and not request.future.done():
                    request.future.set_exception(exc)
                self._release(slot)
            # Donated buffers may be gone: start from an empty cache, full prefills.
            for slot in self._slots:
                slot.tokens = []
            self._cache = self._logits = None
            if self._params is not None:
                self._cache, self._logits = self._kernels.init_state(self._params)

    def _release(self, slot: _Slot) -> None:
        """The slot's request is over; keep its tokens for the session's next turn."""
        request = slot.request
        slot.request = None
        if request is None:
            return
        if not request.abandoned:  # an abandoned one already let its session go
            self._busy_sessions.discard(request.session_id)
        if request.session_id is None or slot.release_when_done:
            slot.session_id, slot.tokens, slot.release_when_done = None, [], False

    # ------------------------------------------------------------------ prefill

    def _prefill(self, admitted: list[tuple[_Slot, int]]) -> None:
        """Encode each admitted prompt's uncached tokens into its slot, grouped by bucket.

        A request's new tokens go into a window of ``bucket`` slots starting at
        its reused prefix. When that window would run past the cache, it is
        slid left to end at the cache's end, re-encoding some cached tokens
        (same tokens, same positions, so the same keys up to rounding).
        """
        by_length: dict[int, list[tuple[int, list[int], int, int]]] = collections.defaultdict(list)
        for slot, reused in admitted:
            prompt = slot.request.prompt
            length = _bucket(len(prompt) - reused, self._prefill_buckets)
            start = min(reused, self._cache_len - length)
            window = prompt[start : start + length]
            by_length[length].append((slot.index, window, start, len(prompt) - 1 - start))
            slot.tokens = list(prompt)
            self._counters["prefill_tokens"] += len(prompt) - start
            self._counters["reused_tokens"] += start

        for length, rows in by_length.items():
            while rows:
                group = self._row_group(len(rows))
                batch, rows = rows[:group], rows[group:]
                row_count = _bucket(len(batch), self._row_buckets)
                indices = np.full(row_count, self._num_slots, np.int32)  # dummies: dropped
                tokens = np.full((row_count, length), self._pad_id, np.int32)
                starts = np.zeros(row_count, np.int32)
                last = np.zeros(row_count, np.int32)
                for row, (index, window, start, last_index) in enumerate(batch):
                    indices[row], starts[row], last[row] = index, start, last_index
                    tokens[row, : len(window)] = window
                self._cache, self._logits = self._kernels.prefill(
                    self._params, self._cache, self._logits, indices, tokens, starts, last
                )
                with self._lock:
                    self._counters["prefill_calls"] += 1

    def _row_group(self, count: int) -> int:
        """Rows to prefill in one call: all of them when padding at most doubles the work,
        else the largest row bucket that they fill."""
        if count <= self._row_buckets[-1] and _bucket(count, self._row_buckets) <= 2 * count:
            return count
        fitting = [b for b in self._row_buckets if b <= count]
        return fitting[-1] if fitting else count

    # ------------------------------------------------------------------ decode

    def _chunk_inputs(self, running: list[_Slot], rows: int) -> tuple[list[int], tuple[np.ndarray, ...]]:
        """The chunk row of each running slot, and the decode kernel's inputs; the other rows are idle.

        Running slots are packed from row 0, except in a chunk of every row,
        where each slot decodes in its own row (the whole cache, in place; see
        ``_decode_traced``).
        """
        if rows == self._num_slots:
            layout = [slot.index for slot in running]
            indices = np.arange(rows, dtype=np.int32)
        else:
            layout = list(range(len(running)))
            indices = np.full(rows, self._num_slots, np.int32)  # dummies: their writes are dropped
        offsets = np.full(rows, self._config.max_seq_len, np.int32)  # idle rows: scratch slot
        active = np.zeros(rows, np.bool_)
        budgets = np.zeros(rows, np.int32)
        counts = np.zeros(rows, np.int32)
        seeds = np.zeros(rows, np.int32)
        temperatures = np.ones(rows, np.float32)
        top_ps = np.ones(rows, np.float32)
        top_ks = np.zeros(rows, np.int32)
        for row, slot in zip(layout, running, strict=True):
            request = slot.request
            indices[row] = slot.index
            offsets[row] = len(slot.tokens)
            active[row] = True
            budgets[row] = request.max_new_tokens - len(request.token_ids)
            counts[row] = len(request.token_ids)
            seeds[row] = request.seed
            temperatures[row] = request.temperature
            top_ps[row] = request.top_p
            top_ks[row] = request.top_k
        return layout, (indices, offsets, active, budgets, counts, seeds, temperatures, top_ps, top_ks)

    def _decode_chunk(
        self, running: list[_Slot]
    ) -> list[tuple[_Request, Completion | BaseException]]:
        rows = _bucket(len(running), self._row_buckets)
        layout, inputs = self._chunk_inputs(running, rows)
        self._cache, self._logits, tokens, logprobs, produced = self._kernels.decode(
            self._params, self._cache, self._logits, *inputs, rows=rows
        )
        tokens, logprobs, produced = np.asarray(tokens), np.asarray(logprobs), np.asarray(produced)

        finished = []
        with self._lock:
            self._counters["decode_chunks"] += 1
            self._counters["decode_rows"] += rows
            for row, slot in zip(layout, running, strict=True):
                request = slot.request
                count = int(produced[row])
                if count == 0:
                    continue
                if request.first_version is None:
                    request.first_version = self._version
                request.last_version = self._version
                new_tokens = tokens[row, :count].tolist()
                request.token_ids.extend(new_tokens)
                request.logprobs.extend(logprobs[row, :count].tolist())
                slot.tokens.extend(new_tokens)
                if request.abandoned:
                    self._release(slot)
                    finished.append((request, concurrent.futures.CancelledError()))
                    continue
                completion = self._completion_if_done(request)
                if completion is None:
                    continue
                # Tokens cut after a stop string stay in the cache as stale slots.
                del slot.tokens[len(request.prompt) + len(completion.token_ids) :]
                self._clock += 1
                slot.last_used = self._clock
                self._counters["generated_tokens"] += len(completion.token_ids)
                self._release(slot)
                finished.append((request, completion))
        return finished

    def _completion_if_done(self, request: _Request) -> Completion | None:
        keep, reason = len(request.token_ids), None
        if request.stop:
            cut = self._stop_cut(request)
            if cut is not None:
                keep, reason = cut, "stop"
        if reason is None:
            if request.token_ids[-1] == self._eos_id:
                reason = "eos"
            elif len(request.token_ids) >= request.max_new_tokens:
                reason = "length"
            else:
                return None
        return Completion(
            token_ids=request.token_ids[:keep],
            logprobs=request.logprobs[:keep],
            finished=reason != "length",
            stop_reason=reason,
            policy_version=request.first_version,
            last_policy_version=request.last_version,
        )

    def _stop_cut(self, request: _Request) -> int | None:
        """Generated tokens to keep, up to and including the first stop string; None if none."""
        tokens = request.token_ids
        if not any(text in self._detokenize(tokens) for text in request.stop):
            request.stop_checked = len(tokens)
            return None
        # The shortest prefix whose text holds a stop string; earlier prefixes were clean.
        for keep in range(request.stop_checked + 1, len(tokens) + 1):
            text = self._detokenize(tokens[:keep])
            if any(stop in text for stop in request.stop):
                return keep
        return len(tokens)


@dataclasses.dataclass(frozen=True)
class _KernelShape:
    """Everything an engine's compiled functions depend on besides their arguments."""

    graphdef: nnx.GraphDef[Transformer]
    config: TransformerConfig
    num_slots: int
    chunk_size: int
    eos_id: int
    pad_id: int
    cache_dtype: Any


class _Kernels:
    """The jitted prefill, decode and cache-initialisation functions of one :class:`_KernelShape`.

    Engines of the same shape share one instance (:func:`_kernels_for`), so a
    new engine, e.g. a worker's runtime for the next run of the same model,
    reuses every compiled bucket instead of tracing and compiling them again
    (about 11 s for a nano model's 21 buckets on two CPU cores, paid mid-run).
    """

    def __init__(self, shape: _KernelShape):
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
        tokens: jax.Array,
        starts: jax.Array,
        last_index: jax.Array,
    ) -> tuple[KVCache, jax.Array]:
        """Write the windows ``tokens`` [n, P] into cache rows ``rows`` at ``starts``.

        Rows equal to ``num_slots`` are padding: their reads are clipped and
        their writes dropped. Stores the logits at ``last_index`` (the last
        prompt token) of each row, from which the first new token is sampled.
        """
        self.trace_counts["prefill"] += 1
        model = nnx.merge(self._graphdef, params)
        count, length = tokens.shape
        row_cache = [
            {name: array.at[rows].get(mode="clip") for name, array in layer.items()}
            for layer in cache
        ]
        positions = starts[:, None] + jnp.arange(length, dtype=jnp.int32)[None, :]
        # Right padding and stale slots lie after the real tokens: causality hides them.
        key_mask = jnp.ones((count, self._cache_len), jnp.bool_)
        window_logits, row_cache = model.decode(tokens, positions, row_cache, starts, key_mask)
        last_logits = jnp.take_along_axis(window_logits, last_index[:, None, None], axis=1)[:, 0]
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
        # number counts + s, and the noise of every step can be drawn up front.
        steps = jnp.arange(chunk, dtype=jnp.int32)
        keys = jax.vmap(
            lambda seed, count: jax.vmap(jax.random.fold_in, in_axes=(None, 0))(
                jax.random.key(seed), count + steps
            ),
            out_axes=1,
        )(seeds, counts)  # [chunk, rows]
        noise = gumbel_noise(keys, self._config.vocab_size)

        def decode_step(carry):
            step, row_cache, row_logits, offsets, active, produced, tokens, logprobs = carry
            token, token_logprob = sample_with_noise(
                row_logits, temperatures, top_ps, top_ks, noise[step]
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
def _kernels_for(shape: _KernelShape) -> _Kernels:
    return _Kernels(shape)
