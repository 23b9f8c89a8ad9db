"""Every Tandem process's own CPU and memory, and its host's, reported to Redis every few seconds.

Each process (the ASGI web server, the platform worker and its Celery beat,
rollout workers, trainers) runs one :class:`ProcessReporter`: a daemon thread
that writes a :class:`~tandem.contracts.ProcessReport` to the hash
:func:`~tandem.contracts.process_reports_key` every ``interval_s`` seconds
(``TANDEM_PROCESS_REPORT_INTERVAL_S``, default 5), busy or idle. A report
costs one sample of :class:`~tandem.runtime.resource_usage.ResourceSampler` and one ``HSET``: well under a millisecond of CPU.

:func:`live_process_reports` reads them back: a report older than 3 of its
process's intervals belongs to a dead process (a live one never misses that
many), and the reader deletes it, so the hash does not grow as processes come
and go. A process that stops cleanly deletes its own report at once.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import psutil
import pydantic
import redis

from tandem.contracts import ProcessReport, ProcessRole, process_report_field, process_reports_key
from tandem.runtime.resource_usage import ResourceSampler

logger = logging.getLogger("tandem.runtime.process_reports")

#: Seconds between a process's reports, unless ``TANDEM_PROCESS_REPORT_INTERVAL_S`` says otherwise.
DEFAULT_INTERVAL_S = 5.0
INTERVAL_ENV = "TANDEM_PROCESS_REPORT_INTERVAL_S"

# The hash outlives its last writer by this much; every report renews it. Fields of
# dead processes are pruned by readers; this only clears a deployment that stopped.
_HASH_TTL_S = 3600

# Deletes a stale field only if it still holds the stale report: a process that
# reported again between the read and the prune keeps its new report.
_DELETE_IF_UNCHANGED = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
"""

_ROLE_ORDER = {"web": 0, "platform_worker": 1, "rollout_worker": 2, "trainer": 3, "export_worker": 4}


def report_interval_s() -> float:
    """The configured interval; a bad or non-positive value falls back to the default, with a warning."""
    raw = os.environ.get(INTERVAL_ENV)
    if not raw:
        return DEFAULT_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if value <= 0:
        logger.warning("%s=%r is not a positive number of seconds; using %s", INTERVAL_ENV, raw,
                       DEFAULT_INTERVAL_S)
        return DEFAULT_INTERVAL_S
    return value


@dataclass(frozen=True)
class TrainerDevice:
    """What a trainer says of its accelerator in its reports (see ProcessReport): the memory XLA may use on
    its smallest device, and their JAX platform."""

    memory_bytes: int | None
    platform: str | None


class ProcessSampler:
    """Builds this process's reports; each report's rates cover the time since the previous one.

    ``process`` (a ``psutil.Process``) and ``clock`` are injectable so tests can
    sample another process, or control time.
    """

    def __init__(self, *, role: ProcessRole, name: str = "", interval_s: float,
                 run_ids: Callable[[], Iterable[int]] | None = None, device: TrainerDevice | None = None,
                 process: psutil.Process | None = None, clock: Callable[[], float] = time.time):
        self.role = role
        self.device = device or TrainerDevice(memory_bytes=None, platform=None)
        self.name = name
        self.interval_s = interval_s
        self.hostname = socket.gethostname()
        self._run_ids = run_ids
        self._usage = ResourceSampler(process=process, clock=clock)

    @property
    def field(self) -> str:
        return process_report_field(self.role, self.hostname, self._usage.process.pid)

    def sample(self) -> ProcessReport:
        usage = self._usage.sample()
        return ProcessReport(
            role=self.role, name=self.name, hostname=self.hostname, pid=self._usage.process.pid,
            started_at=self._usage.started_at, reported_at=usage.at, interval_s=self.interval_s,
            cpu_cores=usage.cpu_cores, rss_bytes=usage.rss_bytes, host_cpu_count=usage.host_cpu_count,
            host_cpu_percent=usage.host_cpu_percent, host_memory_used_bytes=usage.host_memory_used_bytes,
            host_memory_total_bytes=usage.host_memory_total_bytes,
            run_ids=sorted(set(self._run_ids())) if self._run_ids is not None else [],
            device_memory_bytes=self.device.memory_bytes, device_platform=self.device.platform,
        )


class ProcessReporter:
    """A daemon thread that writes this process's :class:`ProcessReport` every ``interval_s`` seconds.

    It never raises into its host process: a failed sample or write (Redis
    down, say) is logged once, and it tries again at the next interval.
    """

    def __init__(self, *, redis_url: str, role: ProcessRole, name: str = "",
                 run_ids: Callable[[], Iterable[int]] | None = None, interval_s: float | None = None,
                 device: TrainerDevice | None = None):
        self.interval_s = interval_s if interval_s is not None else report_interval_s()
        self.sampler = ProcessSampler(role=role, name=name, interval_s=self.interval_s, run_ids=run_ids,
                                      device=device)
        self._client = redis.Redis.from_url(redis_url, socket_timeout=2, socket_connect_timeout=2)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"tandem-process-report-{role}", daemon=True)
        self._failing = False

    def start(self) -> ProcessReporter:
        self._thread.start()
        return self

    def report_once(self) -> ProcessReport:
        report = self.sampler.sample()
        with self._client.pipeline(transaction=False) as pipe:
            pipe.hset(process_reports_key(), report.field, report.model_dump_json())
            pipe.expire(process_reports_key(), _HASH_TTL_S)
            pipe.execute()
        return report

    def _loop(self) -> None:
        while True:
            try:
                self.report_once()
                if self._failing:
                    logger.info("process report written again")
                self._failing = False
            except Exception:
                # Logged once per outage with its cause; quiet after that, so a Redis
                # that is down for an hour does not fill the log.
                if not self._failing:
                    logger.warning("process report not written; retrying every %.0f s", self.interval_s,
                                   exc_info=True)
                self._failing = True
            if self._stopping.wait(self.interval_s):
                return

    def stop(self, *, timeout_s: float = 2.0) -> None:
        """Stop reporting and delete this process's report: a clean stop leaves no stale entry."""
        self._stopping.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        try:
            self._client.hdel(process_reports_key(), self.sampler.field)
        except Exception:
            logger.warning("process report not deleted at stop", exc_info=True)
        finally:
            self._client.close()


# This process's reporter. Every process has one; start_process_reporter is idempotent.
_reporter: ProcessReporter | None = None
_reporter_lock = threading.Lock()


def _forget_reporter_in_child() -> None:
    # A forked child (Celery beat embedded in the platform worker) inherits the
    # parent's reporter object but not its thread: it must start its own.
    global _reporter, _reporter_lock
    _reporter = None
    _reporter_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_reporter_in_child)


def start_process_reporter(*, redis_url: str, role: ProcessRole, name: str = "",
                           run_ids: Callable[[], Iterable[int]] | None = None,
                           interval_s: float | None = None,
                           device: TrainerDevice | None = None) -> ProcessReporter | None:
    """Start this process's reporter, unless one is running; None if it could not start (logged).

    ``device``: a trainer's accelerator (see ProcessReport).
    """
    global _reporter
    with _reporter_lock:
        if _reporter is not None:
            return _reporter
        try:
            _reporter = ProcessReporter(redis_url=redis_url, role=role, name=name, run_ids=run_ids,
                                        interval_s=interval_s, device=device).start()
        except Exception:
            logger.warning("process reporter not started", exc_info=True)
            return None
        return _reporter


def stop_process_reporter() -> None:
    """Stop this process's reporter, if it runs; never raises."""
    global _reporter
    with _reporter_lock:
        reporter, _reporter = _reporter, None
    if reporter is not None:
        try:
            reporter.stop()
        except Exception:
            logger.warning("process reporter did not stop cleanly", exc_info=True)


def _stale_unreadable(raw: bytes, now: float) -> bool:
    """Whether a report this reader cannot parse (a newer schema, say) is stale all the same."""
    try:
        data = json.loads(raw)
        reported_at = float(data["reported_at"])
        interval_s = float(data.get("interval_s", DEFAULT_INTERVAL_S))
    except (ValueError, TypeError, KeyError):
        return True  # not a report at all: nothing will ever read it
    return now - reported_at > 3 * interval_s


def live_process_reports(client: redis.Redis, *, now: float | None = None) -> list[ProcessReport]:
    """Every live process's newest report, by role, host, name and pid; stale reports are deleted.

    Reports of a newer schema that this reader cannot parse are left out but
    kept (unless stale), for the newer readers that can.
    """
    now = time.time() if now is None else now
    raw_reports = client.hgetall(process_reports_key())
    live: list[ProcessReport] = []
    stale: list[tuple[bytes, bytes]] = []
    for field, raw in raw_reports.items():
        try:
            report = ProcessReport.model_validate_json(raw)
        except pydantic.ValidationError:
            if _stale_unreadable(raw, now):
                stale.append((field, raw))
            continue
        if report.is_live(now):
            live.append(report)
        else:
            stale.append((field, raw))
    if stale:
        delete_if_unchanged = client.register_script(_DELETE_IF_UNCHANGED)
        with client.pipeline(transaction=False) as pipe:
            for field, raw in stale:
                delete_if_unchanged(keys=[process_reports_key()], args=[field, raw], client=pipe)
            pipe.execute()
    return sorted(live, key=lambda r: (_ROLE_ORDER.get(r.role, 9), r.hostname, r.name, r.pid))


def live_process_reports_at(redis_url: str) -> list[ProcessReport] | None:
    """:func:`live_process_reports` of the Redis at ``redis_url``, on a client of its own; None (logged)
    when that Redis cannot be read, for readers that show or check what they can without it."""
    try:
        client = redis.Redis.from_url(redis_url, socket_timeout=2, socket_connect_timeout=2)
        try:
            return live_process_reports(client)
        finally:
            client.close()
    except redis.RedisError as exc:
        logger.warning("process reports not read: %s", exc)
        return None
