""":class:`InferenceEngine`: the slot scheduler driving the jitted kernels, served by a thread.

The engine owns the device state (parameters, KV cache, stored logits), the
lock over the scheduler, the weights staged between chunks, and the thread
that runs steps; :mod:`policy.engine.scheduler` decides what each step does
and :mod:`policy.engine.kernels` does it. See :mod:`policy.engine` for what
the engine guarantees.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from policy.engine.admission import RefillHold
from policy.engine.kernels import KernelShape, kernels_for
from policy.engine.scheduler import Request, SamplingParams, Scheduler, Slot, StopReason
from policy.model import KVCache, Transformer, TransformerConfig

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Completion:
    """One generated turn.

    ``token_ids`` ends with EOS when ``stop_reason == "eos"``, right after the
    first occurrence of a stop string when ``"stop"`` (the stop text is kept),
    and has ``max_new_tokens`` tokens when ``"length"``. ``finished`` is True
    unless the turn was cut off by ``max_new_tokens``.

    ``logprobs[i]`` is the behaviour log-probability of ``token_ids[i]`` under
    the temperature-scaled distribution, before top-k/top-p truncation (see
    :mod:`policy.engine.sampling`).

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
    # Prompt tokens served from a cached prefix instead: the slot's own or another slot's.
    reused_tokens: int
    # The part of reused_tokens copied from another slot (a prompt shared across sessions).
    shared_tokens: int
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
    # Seconds the background thread held a chunk back for refills of rows that just finished
    # (policy.engine.admission); the device is idle then.
    held_s: float = 0.0


def _completion(request: Request) -> Completion:
    """What a finished (not abandoned) request returns to its caller."""
    return Completion(
        token_ids=request.token_ids,
        logprobs=request.logprobs,
        finished=request.stop_reason != "length",
        stop_reason=request.stop_reason,
        policy_version=request.first_version,
        last_policy_version=request.last_version,
    )


class InferenceEngine:
    """Slot-based continuous batching for one policy; see :mod:`policy.engine`.

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
      refill_hold_fraction: the background thread may hold a chunk, for at most this fraction
        of the last chunk's time, while the rows the last chunk finished are refilled, when
        recent refills came that soon (:class:`~policy.engine.admission.RefillHold`); 0 never holds.
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
        refill_hold_fraction: float = 0.0,
    ):
        if num_slots < 1 or chunk_size < 1:
            raise ValueError("num_slots and chunk_size must be at least 1")
        self._between_chunks = between_chunks
        self._background = background
        self._idle_exit_s = idle_exit_s

        # Host state, guarded by _lock. Steps are serialised by _step_lock and
        # take _lock only for bookkeeping, never while a chunk runs.
        self._lock = threading.Condition()
        self._step_lock = threading.Lock()
        self._scheduler = Scheduler(
            num_slots=num_slots,
            max_seq_len=config.max_seq_len,
            eos_id=eos_id,
            pad_id=pad_id,
            prefill_buckets=prefill_buckets,
            row_buckets=row_buckets,
            detokenize=detokenize,
            reuse_prefix=reuse_prefix,
        )
        self._pending_params: tuple[nnx.State, int] | None = None
        self._has_params = False
        self._thread: threading.Thread | None = None
        self._closed = False
        # prefill_calls, decode_chunks, decode_rows; the scheduler counts tokens and evictions.
        self._counters: collections.Counter[str] = collections.Counter()
        self._busy_s = 0.0
        self._held_s = 0.0
        # Only the background thread holds; a caller that drives steps itself decides when they run.
        self._refills = RefillHold(refill_hold_fraction if background else 0.0)

        # Device state, touched only inside steps.
        self._params: nnx.State | None = None
        self._version = 0
        self._cache: KVCache | None = None
        self._logits: jax.Array | None = None

        self._kernels = kernels_for(KernelShape(
            graphdef=graphdef, config=config, num_slots=num_slots, chunk_size=chunk_size,
            eos_id=eos_id, pad_id=pad_id, cache_dtype=cache_dtype,
        ))

    # ------------------------------------------------------------------ public API

    @property
    def num_slots(self) -> int:
        return self._scheduler.num_slots

    @property
    def policy_version(self) -> int:
        """Version of the weights the next chunk will run with (staged ones included)."""
        with self._lock:
            return self._pending_params[1] if self._pending_params else self._version

    @property
    def session_count(self) -> int:
        """Sessions holding a slot (with a cached prefix or a request in flight)."""
        with self._lock:
            return self._scheduler.session_count

    def cached_length(self, session_id: Hashable) -> int:
        """Tokens of the session whose keys and values are in its slot (0 if it has none)."""
        with self._lock:
            return self._scheduler.cached_length(session_id)

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
            scheduled = self._scheduler.counters
            return EngineStats(
                prefill_tokens=scheduled["prefill_tokens"],
                reused_tokens=scheduled["reused_tokens"],
                shared_tokens=scheduled["shared_tokens"],
                generated_tokens=scheduled["generated_tokens"],
                prefill_calls=self._counters["prefill_calls"],
                decode_chunks=self._counters["decode_chunks"],
                decode_rows=self._counters["decode_rows"],
                evictions=scheduled["evictions"],
                busy_s=self._busy_s,
                held_s=self._held_s,
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
        sampling: SamplingParams,
    ) -> concurrent.futures.Future:
        """Queue one turn; the future resolves to a :class:`Completion`.

        ``session_id`` None is a one-off request whose slot is freed at once.
        A session may have one request in flight at a time. The completion
        depends only on the prompt, ``sampling`` (its seed included) and the
        weights, not on what else is being decoded (up to float rounding of
        differently shaped batches).

        Raises:
          ValueError: the prompt is empty or does not fit with max_new_tokens,
            stop strings without ``detokenize``, or the session is busy.
          RuntimeError: no weights were set yet, or the engine is closed.
        """
        request = self._scheduler.new_request(session_id, prompt_tokens, sampling)
        with self._lock:
            if self._closed:
                raise RuntimeError("the inference engine is closed")
            if not self._has_params:
                raise RuntimeError("no weights yet: call set_params before generating")
            self._scheduler.enqueue(request)
            self._refills.submitted(time.monotonic())
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
        sampling: SamplingParams,
    ) -> Completion:
        """:meth:`submit`, awaited from an event loop (needs ``background=True``).

        Cancelling the awaiting task also stops the turn in the engine, at the
        next chunk boundary (the session keeps the tokens decoded so far).
        """
        future = self.submit(session_id, prompt_tokens, sampling)
        try:
            return await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            with self._lock:
                self._scheduler.abandon(future)
            raise

    def end_session(self, session_id: Hashable) -> None:
        """Free the session's slot (after its in-flight request, if any). Idempotent."""
        with self._lock:
            self._scheduler.end_session(session_id)

    def close(self) -> None:
        """Stop the background thread; queued and running requests are cancelled."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self._step_lock, self._lock:
            self._scheduler.cancel_all(RuntimeError("the inference engine was closed"))

    def warmup(self) -> bool:
        """Compile every prefill and decode bucket now, with all rows idle; returns whether it ran.

        Needs weights (:meth:`set_params`). Cached sessions are not disturbed:
        idle rows only write their scratch slot, and dummy prefill rows are
        dropped. An engine whose kernels (shared by engines of its shape) were
        warmed up for the same buckets and weights' shapes has nothing to
        compile, and does not run them again (seconds per bucket of a real
        model on a CPU).
        """
        scheduler = self._scheduler
        with self._step_lock:
            with self._lock:
                self._apply_pending_params()
            if self._params is None:
                raise RuntimeError("no weights yet: call set_params before warmup")
            warmed = (tuple(scheduler.prefill_buckets), tuple(scheduler.row_buckets),
                      tuple((leaf.shape, str(leaf.dtype)) for leaf in jax.tree.leaves(self._params)))
            if warmed in self._kernels.warmed:
                return False
            for length in scheduler.prefill_buckets:
                for rows in scheduler.row_buckets:
                    self._cache, self._logits = self._kernels.prefill(
                        self._params, self._cache, self._logits,
                        *scheduler.idle_prefill_rows(rows, length),
                    )
            for rows in scheduler.row_buckets:
                _, idle = scheduler.decode_rows([], rows)
                outputs = self._kernels.decode(
                    self._params, self._cache, self._logits, *idle, rows=rows
                )
                self._cache, self._logits = outputs[0], outputs[1]
            jax.block_until_ready(self._cache)
            self._kernels.warmed.add(warmed)
            return True

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
                admitted = self._scheduler.admit()
                running = self._scheduler.running()
            if not running:
                return False
            try:
                if admitted:
                    self._prefill(admitted)
                finished = self._decode_chunk(running)
            except BaseException as exc:
                self._fail_running(running, exc)
                raise
            with self._lock:
                # Counted before their callers hear, so that no refill comes before its row; the rows
                # that requests already queued will take wait for nothing.
                ended = sum(not request.abandoned for request in finished)
                self._refills.finished(max(0, ended - self._scheduler.queued), time.monotonic())
            for request in finished:
                if request.abandoned:
                    request.future.set_exception(concurrent.futures.CancelledError())
                else:
                    request.future.set_result(_completion(request))
            with self._lock:
                self._busy_s += time.perf_counter() - started
            return True

    def run_until(self, futures: Sequence[concurrent.futures.Future]) -> None:
        """Step in the calling thread until every future is done (``background=False``)."""
        while not all(future.done() for future in futures):
            if not self.step():
                raise RuntimeError("the engine is idle but some requests never finished")

    # ------------------------------------------------------------------ the step

    def _serve(self) -> None:
        while True:
            with self._lock:
                idle_since = time.monotonic()
                while not self._closed and not self._scheduler.has_work():
                    remaining = self._idle_exit_s - (time.monotonic() - idle_since)
                    if remaining <= 0:
                        self._thread = None
                        return
                    self._lock.wait(timeout=remaining)
                if self._closed:
                    self._thread = None
                    return
            try:
                self._hold_for_refills()
                worked = self.step()
            except Exception:  # noqa: BLE001 - the failed requests carry the exception
                logger.exception("inference engine step failed")
                worked = True
            if not worked:
                with self._lock:
                    self._lock.wait(timeout=0.01)

    def _hold_for_refills(self) -> None:
        """Wait, as :class:`~policy.engine.admission.RefillHold` says, for the last chunk's rows to be refilled."""
        with self._lock:
            began = time.monotonic()
            while not self._closed:
                until = self._refills.hold_until(time.monotonic())
                if until is None or until <= time.monotonic():
                    break
                self._lock.wait(until - time.monotonic())
            self._held_s += time.monotonic() - began

    def _apply_pending_params(self) -> None:
        if self._pending_params is None:
            return
        self._params, self._version = self._pending_params
        self._pending_params = None
        if self._cache is None:
            self._cache, self._logits = self._kernels.init_state(self._params)

    def _fail_running(self, running: list[Slot], exc: BaseException) -> None:
        with self._lock:
            self._scheduler.fail(running, exc)
            # Donated buffers may be gone: start from an empty cache, full prefills.
            self._cache = self._logits = None
            if self._params is not None:
                self._cache, self._logits = self._kernels.init_state(self._params)

    def _prefill(self, admitted: list[tuple[Slot, int]]) -> None:
        """Encode each admitted prompt's uncached tokens into its slot (see ``Scheduler.prefill_rows``)."""
        for call in self._scheduler.prefill_rows(admitted, version=self._version):
            self._cache, self._logits = self._kernels.prefill(
                self._params, self._cache, self._logits, *call
            )
            with self._lock:
                self._counters["prefill_calls"] += 1

    def _decode_chunk(self, running: list[Slot]) -> list[Request]:
        rows = self._scheduler.decode_row_count(len(running))
        layout, inputs = self._scheduler.decode_rows(running, rows)
        began = time.monotonic()
        self._cache, self._logits, tokens, logprobs, produced = self._kernels.decode(
            self._params, self._cache, self._logits, *inputs, rows=rows
        )
        tokens, logprobs, produced = np.asarray(tokens), np.asarray(logprobs), np.asarray(produced)
        with self._lock:
            self._refills.chunk_ran(time.monotonic() - began)
            self._counters["decode_chunks"] += 1
            self._counters["decode_rows"] += rows
            return self._scheduler.record_chunk(
                running, layout, tokens, logprobs, produced, version=self._version
            )
