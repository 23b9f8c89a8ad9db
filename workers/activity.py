"""How busy this producer process is, reported per run so the trainer can chart producer utilisation."""

from __future__ import annotations

import os
import socket
import threading
import time

import redis

from tandem.contracts import CircuitBreakerReport, ProducerReport, producers_key
from workers.circuit_breaker import circuit_breaker_states

# A report outlives its process by this much, so a dead producer drops out of the charts.
_REPORT_TTL_S = 3600


class ProducerActivity:
    """Busy time of a process whose threads run rollout tasks: busy while at least one runs.

    ``clock`` is injectable so tests need not sleep.
    """

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self._started_at: float | None = None
        self._running = 0
        self._busy_s = 0.0
        self._busy_since: float | None = None
        # run_id -> (episodes, failed)
        self._episodes: dict[int, tuple[int, int]] = {}

    def task_started(self) -> None:
        with self._lock:
            now = self._clock()
            if self._started_at is None:
                self._started_at = now
            if self._running == 0:
                self._busy_since = now
            self._running += 1

    def task_finished(self, *, run_id: int, episodes: int, failed: int) -> None:
        with self._lock:
            self._running -= 1
            if self._running == 0 and self._busy_since is not None:
                self._busy_s += self._clock() - self._busy_since
                self._busy_since = None
            done, done_failed = self._episodes.get(run_id, (0, 0))
            self._episodes[run_id] = (done + episodes, done_failed + failed)

    def snapshot(self, run_id: int) -> tuple[float, float, int, int, int]:
        """``(uptime_s, busy_s, running_tasks, episodes, episodes_failed)`` as of now."""
        with self._lock:
            now = self._clock()
            busy = self._busy_s + (now - self._busy_since if self._busy_since is not None else 0.0)
            uptime = now - self._started_at if self._started_at is not None else 0.0
            episodes, failed = self._episodes.get(run_id, (0, 0))
            return uptime, busy, self._running, episodes, failed


#: This process's activity; rollout tasks update it.
process_activity = ProducerActivity()
WORKER_NAME = f"{socket.gethostname()}:{os.getpid()}"


def report_activity(client: redis.Redis, run_id: int, activity: ProducerActivity = process_activity,
                    *, worker: str = WORKER_NAME) -> ProducerReport:
    """Write this process's :class:`ProducerReport` for ``run_id`` (with its circuit breakers)."""
    uptime, busy, running, episodes, failed = activity.snapshot(run_id)
    report = ProducerReport(
        worker=worker, reported_at=time.time(), uptime_s=uptime, busy_s=busy, running_tasks=running,
        episodes=episodes, episodes_failed=failed,
        circuit_breakers={
            name: CircuitBreakerReport(state=state["state"], consecutive_failures=state["consecutive_failures"],
                                       last_failure_reason=state["last_failure_reason"])
            for name, state in circuit_breaker_states().items()
        },
    )
    with client.pipeline(transaction=False) as pipe:
        pipe.hset(producers_key(run_id), worker, report.model_dump_json())
        pipe.expire(producers_key(run_id), _REPORT_TTL_S)
        pipe.execute()
    return report
