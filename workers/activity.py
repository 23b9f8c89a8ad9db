"""How busy this producer process is and where its time goes, reported per run for the trainer's charts."""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass

import psutil
import redis

from tandem.contracts import CircuitBreakerReport, EpisodeTimings, ProducerReport, producers_key
from workers.circuit_breaker import circuit_breaker_states

# A report outlives its process by this much, so a dead producer drops out of the charts.
_REPORT_TTL_S = 3600


@dataclass
class EpisodeTime:
    """Cumulative seconds of one run's finished episodes in this process (see ProducerReport)."""

    episode_s: float = 0.0
    generation_s: float = 0.0
    environment_s: float = 0.0
    tool_s: float = 0.0
    stream_put_s: float = 0.0


class ProducerActivity:
    """Busy time of a process whose threads run rollout tasks: busy while at least one runs.

    ``clock`` is injectable so tests need not sleep.
    """

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self._started_at: float | None = None
        self._running = 0
        # run_id -> rollout tasks of that run running now (for this process's ProcessReport)
        self._running_by_run: dict[int, int] = {}
        self._busy_s = 0.0
        self._busy_since: float | None = None
        # run_id -> (episodes, failed)
        self._episodes: dict[int, tuple[int, int]] = {}
        self._episode_time: dict[int, EpisodeTime] = {}

    def task_started(self, *, run_id: int | None = None) -> None:
        with self._lock:
            now = self._clock()
            if self._started_at is None:
                self._started_at = now
            if self._running == 0:
                self._busy_since = now
            self._running += 1
            if run_id is not None:
                self._running_by_run[run_id] = self._running_by_run.get(run_id, 0) + 1

    def task_finished(self, *, run_id: int, episodes: int, failed: int) -> None:
        with self._lock:
            self._running -= 1
            if run_id in self._running_by_run:
                self._running_by_run[run_id] -= 1
                if self._running_by_run[run_id] <= 0:
                    del self._running_by_run[run_id]
            if self._running == 0 and self._busy_since is not None:
                self._busy_s += self._clock() - self._busy_since
                self._busy_since = None
            done, done_failed = self._episodes.get(run_id, (0, 0))
            self._episodes[run_id] = (done + episodes, done_failed + failed)

    def episode_finished(self, *, run_id: int, timings: EpisodeTimings, stream_put_s: float) -> None:
        """Count one episode's time: its own timings and the XADD that handed it to the trainer."""
        with self._lock:
            time_spent = self._episode_time.setdefault(run_id, EpisodeTime())
            time_spent.episode_s += max(timings.finished_at - timings.started_at, 0.0)
            time_spent.generation_s += timings.generation_s
            time_spent.environment_s += timings.environment_s
            time_spent.tool_s += timings.tool_s
            time_spent.stream_put_s += stream_put_s

    def episode_time(self, run_id: int) -> EpisodeTime:
        with self._lock:
            spent = self._episode_time.get(run_id, EpisodeTime())
            return EpisodeTime(**vars(spent))

    def running_run_ids(self) -> list[int]:
        """Runs with a rollout task running in this process now."""
        with self._lock:
            return sorted(self._running_by_run)

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


# Task threads report as their tasks start and end. Taking the snapshot and writing it under one
# lock keeps the writes in snapshot order: otherwise a thread's older snapshot could land last and
# show a task running after the process went idle.
_report_lock = threading.Lock()


def report_activity(client: redis.Redis, run_id: int, activity: ProducerActivity = process_activity,
                    *, worker: str = WORKER_NAME) -> ProducerReport:
    """Write this process's :class:`ProducerReport` for ``run_id`` (with its circuit breakers)."""
    with _report_lock:
        return _write_report(client, run_id, activity, worker=worker)


def _write_report(client: redis.Redis, run_id: int, activity: ProducerActivity, *, worker: str) -> ProducerReport:
    uptime, busy, running, episodes, failed = activity.snapshot(run_id)
    process = psutil.Process()
    cpu = process.cpu_times()
    report = ProducerReport(
        worker=worker, reported_at=time.time(), uptime_s=uptime, busy_s=busy, running_tasks=running,
        episodes=episodes, episodes_failed=failed, **vars(activity.episode_time(run_id)),
        cpu_s=cpu.user + cpu.system, rss_bytes=process.memory_info().rss,
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
