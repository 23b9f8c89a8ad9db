"""The slot scheduler: which request decodes in which KV-cache row, and what each step feeds the kernels.

Host-side bookkeeping only (no JAX): the queue of requests, the slots and the
sessions holding them, admission with prefix matching and least-recently-used
eviction, the padded index arrays of a prefill group or a decode chunk
(:class:`PrefillRows`, :class:`DecodeRows`, in the argument order of
:mod:`policy.engine.kernels`), and the bookkeeping of a chunk's tokens: stop
strings, EOS, budgets, abandoned callers.

A :class:`Scheduler` is not thread-safe: :class:`~policy.engine.engine.InferenceEngine`
guards it with its lock, except for the calls made inside a step (which steps
serialise), as noted on each method.
"""

from __future__ import annotations

import bisect
import collections
import concurrent.futures
import dataclasses
from collections.abc import Callable, Hashable, Sequence
from typing import Literal, NamedTuple

import numpy as np

StopReason = Literal["eos", "stop", "length"]

# Shortest prefill length bucket; observations between turns are short.
_MIN_PREFILL_BUCKET = 16


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """How one turn is sampled: what every caller of the engine passes with a prompt.

    The completion depends only on the prompt, these parameters and the weights,
    not on what else is being decoded. Out-of-range values raise
    ``ValueError`` naming the field when the parameters are built; whether
    ``max_new_tokens`` fits after a prompt, and whether the engine can detect
    stop strings, is checked when a turn is submitted.

    Attributes:
      max_new_tokens: the most tokens the turn generates (at least 1).
      temperature: divides the logits before sampling (> 0; the behaviour
        log-probs are those of the tempered distribution).
      top_p: nucleus truncation, in (0, 1]; 1 disables it.
      top_k: keep only the k most likely tokens; 0 disables it.
      stop: strings that end the turn once the decoded text contains one
        (needs an engine built with ``detokenize=``); none may be empty.
      seed: the turn's random key (only its low 31 bits are used).
    """

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop: tuple[str, ...] = ()
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.max_new_tokens >= 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be positive, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not self.top_k >= 0:
            raise ValueError(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if isinstance(self.stop, str):
            raise ValueError(f"stop must be a sequence of strings, got the string {self.stop!r}")
        stop = tuple(self.stop)
        if any(not isinstance(text, str) or not text for text in stop):
            raise ValueError(f"stop strings must be non-empty strings, got {stop!r}")
        for name, value in (
            ("max_new_tokens", int(self.max_new_tokens)),
            ("temperature", float(self.temperature)),
            ("top_p", float(self.top_p)),
            ("top_k", int(self.top_k)),
            ("stop", stop),
            ("seed", int(self.seed) & 0x7FFFFFFF),
        ):
            object.__setattr__(self, name, value)


@dataclasses.dataclass
class Request:
    """One queued or running turn."""

    session_id: Hashable | None
    prompt: list[int]
    sampling: SamplingParams
    future: concurrent.futures.Future
    token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    first_version: int | None = None
    last_version: int = 0
    # Generated tokens already known to contain no stop string.
    stop_checked: int = 0
    # Its caller went away: drop it at the next chunk boundary.
    abandoned: bool = False
    # Set when the turn is over; token_ids and logprobs are then cut to what it returns.
    stop_reason: StopReason | None = None


@dataclasses.dataclass
class Slot:
    """One row of the KV cache."""

    index: int
    session_id: Hashable | None = None
    # Tokens whose keys and values sit at slots 0 .. len(tokens) - 1 of this row.
    tokens: list[int] = dataclasses.field(default_factory=list)
    request: Request | None = None
    last_used: int = 0
    release_when_done: bool = False
    # The oldest weights' version among those that computed the cached keys and values.
    cache_version: int = 0


class PrefillRows(NamedTuple):
    """One prefill call's inputs: windows of ``length`` tokens written into cache rows."""

    # Cache row of each window; num_slots marks a padding row (reads clipped, writes dropped).
    indices: np.ndarray
    # Cache row whose slots before the window's start the window continues: its own row, or
    # another one holding the same prefix (copied along); num_slots on padding rows.
    sources: np.ndarray
    # [rows, length] the tokens, right-padded.
    tokens: np.ndarray
    # Slot of each window's first token.
    starts: np.ndarray
    # Index in the window of the last prompt token, whose logits seed the first sample.
    last_index: np.ndarray


class DecodeRows(NamedTuple):
    """One decode chunk's inputs, a row per entry; idle rows are inactive with no budget."""

    # Cache row each chunk row reads and writes; num_slots marks a dummy row.
    indices: np.ndarray
    # Slot the row's next token is written to (idle rows: the scratch slot max_seq_len).
    offsets: np.ndarray
    active: np.ndarray
    # Tokens the row may still generate in its turn.
    budgets: np.ndarray
    # Tokens the row generated so far in its turn (the next one's key is fold_in(seed, count)).
    counts: np.ndarray
    seeds: np.ndarray
    temperatures: np.ndarray
    top_ps: np.ndarray
    top_ks: np.ndarray


def bucket(size: int, buckets: Sequence[int]) -> int:
    """Smallest bucket >= size; callers have checked that one exists."""
    return buckets[bisect.bisect_left(buckets, size)]


def default_prefill_buckets(max_seq_len: int) -> tuple[int, ...]:
    buckets, size = [], _MIN_PREFILL_BUCKET
    while size < max_seq_len:
        buckets.append(size)
        size *= 2
    return (*buckets, max_seq_len)


def default_row_buckets(num_slots: int) -> tuple[int, ...]:
    """Powers of four up to ``num_slots``: few compilations, at most 4x padding."""
    buckets, size = [], 1
    while size < num_slots:
        buckets.append(size)
        size *= 4
    return (*buckets, num_slots)


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    length = min(len(a), len(b))
    for index in range(length):
        if a[index] != b[index]:
            return index
    return length


class Scheduler:
    """Requests, slots and sessions of one engine; see the module docstring.

    Args:
      num_slots, max_seq_len: rows of the KV cache and tokens per row.
      eos_id: ends a turn (and is kept); pad_id fills padded windows.
      prefill_buckets, row_buckets: as in :class:`~policy.engine.engine.InferenceEngine`
        (None: the defaults); capped at max_seq_len and num_slots, which are
        always buckets.
      detokenize: token ids -> text, needed for stop strings.
      reuse_prefix: False re-encodes every prompt in full.
    """

    def __init__(
        self,
        *,
        num_slots: int,
        max_seq_len: int,
        eos_id: int,
        pad_id: int,
        prefill_buckets: Sequence[int] | None = None,
        row_buckets: Sequence[int] | None = None,
        detokenize: Callable[[list[int]], str] | None = None,
        reuse_prefix: bool = True,
    ):
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        # One scratch slot past max_seq_len: rows that are not decoding write there.
        self.cache_len = max_seq_len + 1
        self._eos_id = eos_id
        self._pad_id = pad_id
        prefill_buckets = prefill_buckets or default_prefill_buckets(max_seq_len)
        row_buckets = row_buckets or default_row_buckets(num_slots)
        # The largest bucket is always the whole slot (or all slots), so every size fits one.
        self.prefill_buckets = tuple(
            sorted({min(b, max_seq_len) for b in prefill_buckets} | {max_seq_len})
        )
        self.row_buckets = tuple(sorted({min(b, num_slots) for b in row_buckets} | {num_slots}))
        self._detokenize = detokenize
        self._reuse_prefix = reuse_prefix

        self._slots = [Slot(index) for index in range(num_slots)]
        self._sessions: dict[Hashable, Slot] = {}
        self._busy_sessions: set[Hashable] = set()
        self._queue: collections.deque[Request] = collections.deque()
        self._clock = 0
        # prefill_tokens, reused_tokens, shared_tokens, generated_tokens, evictions (EngineStats).
        self.counters: collections.Counter[str] = collections.Counter()

    # ------------------------------------------------------------------ requests and sessions

    def new_request(
        self,
        session_id: Hashable | None,
        prompt_tokens: Sequence[int],
        sampling: SamplingParams,
    ) -> Request:
        """A checked request (reads only the configuration: no lock needed).

        Raises:
          ValueError: the prompt is empty or does not fit with max_new_tokens,
            or it has stop strings and the engine no ``detokenize``.
        """
        prompt = [int(token) for token in prompt_tokens]
        max_seq_len = self.max_seq_len
        if not prompt:
            raise ValueError("the prompt is empty; it needs at least one token (e.g. BOS)")
        max_new_tokens = sampling.max_new_tokens
        if len(prompt) + max_new_tokens > max_seq_len:
            raise ValueError(
                f"the prompt has {len(prompt)} tokens; with max_new_tokens={max_new_tokens} "
                f"it exceeds the model's max_seq_len={max_seq_len}"
            )
        if sampling.stop and self._detokenize is None:
            raise ValueError("stop strings need an engine built with detokenize=")
        return Request(
            session_id=session_id,
            prompt=prompt,
            sampling=sampling,
            future=concurrent.futures.Future(),
        )

    def enqueue(self, request: Request) -> None:
        """Queue ``request`` behind the others; a session has one request in flight at a time."""
        session_id = request.session_id
        if session_id is not None:
            if session_id in self._busy_sessions:
                raise ValueError(f"session {session_id!r} already has a request in flight")
            self._busy_sessions.add(session_id)
        self._queue.append(request)

    @property
    def queued(self) -> int:
        """Requests waiting for a slot."""
        return len(self._queue)

    def has_work(self) -> bool:
        return bool(self._queue) or any(slot.request is not None for slot in self._slots)

    @property
    def session_count(self) -> int:
        return len(self._sessions)

    def cached_length(self, session_id: Hashable) -> int:
        slot = self._sessions.get(session_id)
        return 0 if slot is None else len(slot.tokens)

    def abandon(self, future: concurrent.futures.Future) -> None:
        """The caller of ``future`` went away: drop its running request after the current chunk."""
        # A queued request was cancelled with the asyncio future; a running one
        # cannot be, so it is flagged and dropped after the current chunk.
        for slot in self._slots:
            request = slot.request
            if request is not None and request.future is future:
                request.abandoned = True
                # The session may queue its next turn now; it starts once the slot is free.
                self._busy_sessions.discard(request.session_id)

    def end_session(self, session_id: Hashable) -> None:
        slot = self._sessions.pop(session_id, None)
        if slot is None:
            return
        if slot.request is None:
            slot.session_id, slot.tokens = None, []
        else:
            slot.release_when_done = True

    def cancel_all(self, error: BaseException) -> None:
        """Cancel the queued requests and fail the running ones with ``error``."""
        for request in self._queue:
            request.future.cancel()
        self._queue.clear()
        for slot in self._slots:
            if slot.request is not None:
                slot.request.future.set_exception(error)
                slot.request = None
        self._busy_sessions.clear()

    def fail(self, running: list[Slot], error: BaseException) -> None:
        """A step failed: fail its requests and forget every cached prefix (the cache is reset)."""
        for slot in running:
            request = slot.request
            if request is not None and not request.future.done():
                request.future.set_exception(error)
            self._release(slot)
        for slot in self._slots:
            slot.tokens = []

    # ------------------------------------------------------------------ admission

    def admit(self) -> list[tuple[Slot, int]]:
        """Move queued requests into slots (FIFO); returns (slot, reused prefix length)."""
        admitted = []
        waiting: collections.deque[Request] = collections.deque()
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
                    common_prefix_length(slot.tokens, request.prompt), len(request.prompt) - 1
                )
            self._clock += 1
            slot.request, slot.last_used = request, self._clock
            slot.session_id = request.session_id
            if request.session_id is not None:
                self._sessions[request.session_id] = slot
            admitted.append((slot, reused))
        self._queue = waiting
        return admitted

    def running(self) -> list[Slot]:
        return [slot for slot in self._slots if slot.request is not None]

    def _slot_for(self, session_id: Hashable | None) -> Slot | None:
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
        self.counters["evictions"] += 1
        return victim

    def _release(self, slot: Slot) -> None:
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

    def prefill_rows(self, admitted: list[tuple[Slot, int]], *, version: int) -> list[PrefillRows]:
        """The prefill calls that encode each admitted prompt's uncached tokens into its slot.

        Called inside a step. A request's new tokens go into a window of
        ``bucket`` slots starting after the longest cached prefix it has: its
        own slot's (a session's earlier turns) or another slot's (the prompt
        of a sibling episode, a shared system message), whose keys and values
        the kernel copies along. Another slot's prefix is taken only when it
        makes the window a smaller bucket, and only when all of it was
        computed by the current weights (``version``): a new episode never
        starts from keys of an older policy without knowing it, while a
        session's own prefix stays across weight swaps (see
        :mod:`policy.engine`). Slots prefilled in this same step
        can be such a source too: the requests that copy from them run in a
        second wave of calls, after the first wave wrote them.

        When a window would run past the cache, it is slid left to end at the
        cache's end, re-encoding some cached tokens (same tokens, same
        positions, so the same keys up to rounding). Windows of one length
        are grouped into calls of a row bucket each (:meth:`_row_group`).
        """
        waves: list[dict[int, list[tuple[int, int, list[int], int, int]]]] = [
            collections.defaultdict(list), collections.defaultdict(list)
        ]
        written = {slot.index for slot, _ in admitted}
        # Slots of the first wave whose new prompts later requests may copy from.
        leaders: list[Slot] = []
        for slot, reused in admitted:
            prompt = slot.request.prompt
            source, wave = slot.index, 0
            if self._reuse_prefix:
                limit = len(prompt) - 1
                best, best_slot, best_wave = reused, slot, 0
                untouched = (
                    s for s in self._slots
                    if s.index not in written and s.tokens and s.cache_version == version
                )
                for other, other_wave, tokens in (
                    *((s, 0, s.tokens) for s in untouched),
                    *((s, 1, s.request.prompt) for s in leaders if s.cache_version == version),
                ):
                    shared = min(common_prefix_length(tokens, prompt), limit)
                    if shared > best:
                        best, best_slot, best_wave = shared, other, other_wave
                smaller = bucket(len(prompt) - best, self.prefill_buckets) < bucket(
                    len(prompt) - reused, self.prefill_buckets
                )
                if best_slot is not slot and smaller:
                    reused, source, wave = best, best_slot.index, best_wave
            source_version = self._slots[source].cache_version
            slot.cache_version = min(source_version, version) if reused else version
            if wave == 0:
                leaders.append(slot)
            length = bucket(len(prompt) - reused, self.prefill_buckets)
            start = min(reused, self.cache_len - length)
            window = prompt[start : start + length]
            waves[wave][length].append((slot.index, source, window, start, len(prompt) - 1 - start))
            slot.tokens = list(prompt)
            self.counters["prefill_tokens"] += len(prompt) - start
            self.counters["reused_tokens"] += start
            if source != slot.index:
                self.counters["shared_tokens"] += start

        calls = []
        for by_length in waves:
            for length, rows in by_length.items():
                calls.extend(self._prefill_calls(length, rows))
        return calls

    def _prefill_calls(
        self, length: int, rows: list[tuple[int, int, list[int], int, int]]
    ) -> list[PrefillRows]:
        """Calls of one window length: groups of a row bucket each (:meth:`_row_group`)."""
        calls = []
        while rows:
            group = self._row_group(len(rows))
            batch, rows = rows[:group], rows[group:]
            call = self.idle_prefill_rows(bucket(len(batch), self.row_buckets), length)
            for row, (index, source, window, start, last_index) in enumerate(batch):
                call.indices[row], call.sources[row] = index, source
                call.starts[row], call.last_index[row] = start, last_index
                call.tokens[row, : len(window)] = window
            calls.append(call)
        return calls

    def idle_prefill_rows(self, rows: int, length: int) -> PrefillRows:
        """A prefill call of ``rows`` padding rows, which writes nothing (warm-up, and the padding)."""
        return PrefillRows(
            indices=np.full(rows, self.num_slots, np.int32),  # dummies: dropped
            sources=np.full(rows, self.num_slots, np.int32),
            tokens=np.full((rows, length), self._pad_id, np.int32),
            starts=np.zeros(rows, np.int32),
            last_index=np.zeros(rows, np.int32),
        )

    def _row_group(self, count: int) -> int:
        """Rows to prefill in one call: all of them when padding at most doubles the work,
        else the largest row bucket that they fill."""
        if count <= self.row_buckets[-1] and bucket(count, self.row_buckets) <= 2 * count:
            return count
        fitting = [b for b in self.row_buckets if b <= count]
        return fitting[-1] if fitting else count

    # ------------------------------------------------------------------ decode

    def decode_row_count(self, running: int) -> int:
        """Rows of the chunk that decodes ``running`` slots: their row bucket."""
        return bucket(running, self.row_buckets)

    def decode_rows(self, running: list[Slot], rows: int) -> tuple[list[int], DecodeRows]:
        """The chunk row of each running slot, and the decode kernel's inputs; the other rows are idle.

        Called inside a step. Running slots are packed from row 0, except in a
        chunk of every row, where each slot decodes in its own row (the whole
        cache, in place; see :meth:`policy.engine.kernels.Kernels._decode_traced`).
        """
        if rows == self.num_slots:
            layout = [slot.index for slot in running]
            indices = np.arange(rows, dtype=np.int32)
        else:
            layout = list(range(len(running)))
            indices = np.full(rows, self.num_slots, np.int32)  # dummies: their writes are dropped
        offsets = np.full(rows, self.max_seq_len, np.int32)  # idle rows: scratch slot
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
            budgets[row] = request.sampling.max_new_tokens - len(request.token_ids)
            counts[row] = len(request.token_ids)
            seeds[row] = request.sampling.seed
            temperatures[row] = request.sampling.temperature
            top_ps[row] = request.sampling.top_p
            top_ks[row] = request.sampling.top_k
        return layout, DecodeRows(
            indices, offsets, active, budgets, counts, seeds, temperatures, top_ps, top_ks
        )

    def record_chunk(
        self,
        running: list[Slot],
        layout: list[int],
        tokens: np.ndarray,
        logprobs: np.ndarray,
        produced: np.ndarray,
        *,
        version: int,
    ) -> list[Request]:
        """Append a chunk's tokens to their requests and slots; returns the requests now over.

        ``tokens`` and ``logprobs`` are [rows, chunk], ``produced`` [rows],
        with row ``layout[i]`` for ``running[i]``; ``version`` is the weights'
        version the chunk ran with. A returned request is either abandoned
        or has its ``stop_reason`` set and its tokens cut to what it returns;
        its slot is released either way.
        """
        finished = []
        for row, slot in zip(layout, running, strict=True):
            request = slot.request
            count = int(produced[row])
            if count == 0:
                continue
            if request.first_version is None:
                request.first_version = version
            request.last_version = version
            new_tokens = tokens[row, :count].tolist()
            request.token_ids.extend(new_tokens)
            request.logprobs.extend(logprobs[row, :count].tolist())
            slot.tokens.extend(new_tokens)
            if request.abandoned:
                self._release(slot)
                finished.append(request)
                continue
            if not self._finish_if_done(request):
                continue
            # Tokens cut after a stop string stay in the cache as stale slots.
            del slot.tokens[len(request.prompt) + len(request.token_ids) :]
            self._clock += 1
            slot.last_used = self._clock
            self.counters["generated_tokens"] += len(request.token_ids)
            self._release(slot)
            finished.append(request)
        return finished

    def _finish_if_done(self, request: Request) -> bool:
        """Whether the turn is over; if so, sets its stop reason and cuts it after a stop string."""
        keep, reason = len(request.token_ids), None
        if request.sampling.stop:
            cut = self._stop_cut(request)
            if cut is not None:
                keep, reason = cut, "stop"
        if reason is None:
            if request.token_ids[-1] == self._eos_id:
                reason = "eos"
            elif len(request.token_ids) >= request.sampling.max_new_tokens:
                reason = "length"
            else:
                return False
        del request.token_ids[keep:], request.logprobs[keep:]
        request.stop_reason = reason
        return True

    def _stop_cut(self, request: Request) -> int | None:
        """Generated tokens to keep, up to and including the first stop string; None if none."""
        tokens = request.token_ids
        if not any(text in self._detokenize(tokens) for text in request.sampling.stop):
            request.stop_checked = len(tokens)
            return None
        # The shortest prefix whose text holds a stop string; earlier prefixes were clean.
        for keep in range(request.stop_checked + 1, len(tokens) + 1):
            text = self._detokenize(tokens[:keep])
            if any(stop in text for stop in request.sampling.stop):
                return keep
        return len(tokens)
