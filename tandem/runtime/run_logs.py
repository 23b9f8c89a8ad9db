"""Shipping a process's log records to the run they were logged for, through Redis.

A record belongs to a run when it is logged inside that run's scope: a rollout,
evaluation or demonstrations task (:func:`run_log_scope`, a context variable, so
the asyncio tasks a task starts, which copy their context, carry it too), or the
trainer's hold of a run (:func:`process_run_log_scope`: a trainer holds one run at
a time, so every thread of it works for that run). :class:`RunLogShipper`, a
logging handler on the root logger, turns such a record into a
:class:`~tandem.contracts.RunLogRecord` (level, logger, message, traceback, role,
host and pid) and a daemon thread appends batches of them to each run's stream
:func:`~tandem.contracts.run_log_stream`.

Shipping never blocks or breaks the process: ``emit`` only appends to a bounded
buffer; a full buffer, or a batch Redis would not take, is dropped and counted,
and once Redis answers again the count itself is shipped to the run (and logged
here) as a warning, so a gap in a run's log is never silent. Records of a task
whose environment has secret settings pass through the scope's ``redact`` (the
producer sets it once it has loaded them) before they leave the logging call.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import socket
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import redis

from tandem.contracts import (
    RUN_LOG_MESSAGE_CHARS,
    RUN_LOG_STREAM_MAX_ENTRIES,
    RUN_LOG_TRACEBACK_CHARS,
    RunLogRecord,
    RunLogRole,
    run_log_level_name,
    run_log_stream,
)

logger = logging.getLogger("tandem.runtime.run_logs")

#: Records waiting to be shipped, at most; past it new ones are dropped and counted.
BUFFER_RECORDS_MAX = 20000
#: Records one Redis round trip appends at most.
BATCH_RECORDS_MAX = 500
#: Seconds between flushes of a quiet buffer; a full batch goes at once.
FLUSH_INTERVAL_S = 0.5
#: Level below which records are not shipped, unless ``TANDEM_RUN_LOG_LEVEL`` says otherwise.
LEVEL_ENV = "TANDEM_RUN_LOG_LEVEL"
DEFAULT_LEVEL = logging.INFO


@dataclass
class RunLogScope:
    """The run that records logged inside the scope belong to, and how their text is redacted."""

    run_id: int
    # Set once the task has its environment's secret settings (they replace values by names).
    redact: Callable[[str], str] | None = field(default=None, repr=False)

    def redact_with(self, redact: Callable[[str], str]) -> None:
        """Redact every later record of the scope with ``redact`` (asyncio copies of it share this object)."""
        self.redact = redact


_task_scope: contextvars.ContextVar[RunLogScope | None] = contextvars.ContextVar("tandem_run_log_scope",
                                                                                   default=None)
# The trainer's run, seen from every thread of its process (heartbeats, telemetry, checkpoints).
_process_scope: RunLogScope | None = None


def current_run_log_scope() -> RunLogScope | None:
    """The scope of the record being logged now: the task's, else the process's, else None."""
    return _task_scope.get() or _process_scope


@contextlib.contextmanager
def run_log_scope(run_id: int) -> Iterator[RunLogScope]:
    """Records logged inside belong to run ``run_id``: a task's, in its thread and the asyncio tasks it starts."""
    scope = RunLogScope(run_id)
    token = _task_scope.set(scope)
    try:
        yield scope
    finally:
        _task_scope.reset(token)


@contextlib.contextmanager
def process_run_log_scope(run_id: int) -> Iterator[RunLogScope]:
    """Records logged by any thread of this process belong to run ``run_id`` (a trainer's hold of a run)."""
    global _process_scope
    scope = RunLogScope(run_id)
    previous, _process_scope = _process_scope, scope
    try:
        yield scope
    finally:
        _process_scope = previous


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    marker = f"\n[... {len(text) - limit + 64} characters cut]"
    return text[: limit - 64] + marker


class RunLogShipper(logging.Handler):
    """A handler that ships records logged in a run's scope to the run's stream (see the module's docstring).

    ``redis_client`` is injectable for tests; by default one of ``redis_url`` with short
    timeouts and no retries: a Redis that is away costs a dropped batch, never a wait.
    """

    def __init__(self, *, redis_url: str | None = None, role: RunLogRole, level: int | None = None,
                 redis_client: redis.Redis | None = None, flush_interval_s: float = FLUSH_INTERVAL_S,
                 buffer_max: int = BUFFER_RECORDS_MAX, batch_max: int = BATCH_RECORDS_MAX):
        super().__init__(level=level if level is not None else shipped_level())
        if redis_client is None:
            redis_client = redis.Redis.from_url(redis_url, socket_timeout=2, socket_connect_timeout=2)
        self._client = redis_client
        self.role = role
        self.hostname = socket.gethostname()
        self.pid = os.getpid()
        self._flush_interval_s = flush_interval_s
        self._buffer_max = buffer_max
        self._batch_max = batch_max
        self._buffer: list[RunLogRecord] = []
        self._buffer_lock = threading.Lock()
        # Serialises flushes: the thread's and an explicit flush() or close().
        self._flush_lock = threading.Lock()
        self._dropped: Counter[int] = Counter()  # run id -> records not shipped since the last report
        self.dropped_total = 0
        self.shipped_total = 0
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"tandem-run-log-shipper-{role}", daemon=True)
        self._thread.start()

    # -- the logging side: never blocks on Redis -----------------------------------------

    def emit(self, record: logging.LogRecord) -> None:
        scope = current_run_log_scope()
        if scope is None or record.name == logger.name or record.thread == self._thread.ident:
            return  # not a run's; or the shipper's own, which would feed itself
        try:
            entry = self._entry(record, scope)
        except Exception:  # noqa: BLE001 - a record that cannot be turned into an entry is the logging call's bug
            self.handleError(record)
            return
        with self._buffer_lock:
            if len(self._buffer) >= self._buffer_max:
                self._dropped[scope.run_id] += 1
                self.dropped_total += 1
                return
            self._buffer.append(entry)
            full = len(self._buffer) >= self._batch_max
        if full:
            self._wake.set()

    def _entry(self, record: logging.LogRecord, scope: RunLogScope) -> RunLogRecord:
        message = record.getMessage()
        trace = ""
        if record.exc_info and record.exc_info[0] is not None:
            trace = "".join(traceback.format_exception(*record.exc_info))
        elif record.exc_text:
            trace = record.exc_text
        if record.stack_info:
            trace = f"{trace}\n{record.stack_info}" if trace else record.stack_info
        if scope.redact is not None:
            message, trace = scope.redact(message), scope.redact(trace)
        return RunLogRecord(
            run_id=scope.run_id, created=record.created, level=run_log_level_name(record.levelno),
            logger=record.name, message=_cut(message, RUN_LOG_MESSAGE_CHARS),
            traceback=_cut(trace.rstrip("\n"), RUN_LOG_TRACEBACK_CHARS),
            role=self.role, hostname=self.hostname, pid=self.pid,
        )

    # -- the shipping side -------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.wait(self._flush_interval_s)
            self._wake.clear()
            self.flush()

    def flush(self) -> None:
        """Ship what is buffered now, a batch per round trip; a batch Redis refuses is dropped and counted."""
        with self._flush_lock:
            while True:
                with self._buffer_lock:
                    batch, self._buffer = self._buffer[: self._batch_max], self._buffer[self._batch_max:]
                if not batch and not self._dropped:
                    return
                if not self._ship(batch) or not batch:
                    return

    def _ship(self, batch: list[RunLogRecord]) -> bool:
        with self._buffer_lock:
            dropped, self._dropped = self._dropped, Counter()
        reports = [self._dropped_report(run_id, count) for run_id, count in sorted(dropped.items())]
        try:
            with self._client.pipeline(transaction=False) as pipe:
                for entry in [*reports, *batch]:
                    pipe.xadd(run_log_stream(entry.run_id), entry.to_stream_fields(),
                              maxlen=RUN_LOG_STREAM_MAX_ENTRIES, approximate=True)
                pipe.execute()
        except (redis.RedisError, OSError) as exc:
            lost = Counter(entry.run_id for entry in batch)
            with self._buffer_lock:
                self._dropped.update(dropped)
                self._dropped.update(lost)
                self.dropped_total += len(batch)
            logger.warning("could not ship %d run log records (%s: %s); dropped, and counted for their runs",
                           len(batch), type(exc).__name__, exc)
            return False
        self.shipped_total += len(batch)
        for run_id, count in sorted(dropped.items()):
            logger.warning("run %s: %d log records of this process were dropped before they reached Redis",
                           run_id, count)
        return True

    def _dropped_report(self, run_id: int, count: int) -> RunLogRecord:
        return RunLogRecord(
            run_id=run_id, created=time.time(), level="WARNING", logger=logger.name,
            message=f"{count} log records of this process were dropped: Redis was unreachable or the "
                    "shipper's buffer was full",
            role=self.role, hostname=self.hostname, pid=self.pid,
        )

    def close(self) -> None:
        """Stop the thread and ship what is left (one try)."""
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout=5)
        self.flush()
        self._client.close()
        super().close()


def shipped_level() -> int:
    """The lowest level shipped: ``TANDEM_RUN_LOG_LEVEL`` (a name such as ``DEBUG``), else INFO."""
    raw = os.environ.get(LEVEL_ENV, "")
    level = logging.getLevelName(raw.upper()) if raw else DEFAULT_LEVEL
    if not isinstance(level, int):
        logger.warning("%s=%r is not a logging level; shipping INFO and above", LEVEL_ENV, raw)
        return DEFAULT_LEVEL
    return level


_installed: RunLogShipper | None = None
_install_lock = threading.Lock()


def start_run_log_shipping(*, redis_url: str, role: RunLogRole) -> RunLogShipper:
    """Install this process's shipper on the root logger (once; a second call returns the first)."""
    global _installed
    with _install_lock:
        if _installed is None:
            _installed = RunLogShipper(redis_url=redis_url, role=role)
            logging.getLogger().addHandler(_installed)
        return _installed


def stop_run_log_shipping() -> None:
    """Ship what is left and take the shipper off the root logger."""
    global _installed
    with _install_lock:
        if _installed is not None:
            logging.getLogger().removeHandler(_installed)
            _installed.close()
            _installed = None
