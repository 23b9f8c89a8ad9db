"""Producer utilisation, timings and circuit breakers, per trainer step, from the producers' own reports."""

from __future__ import annotations

import logging
import time

import redis
from pydantic import ValidationError

from tandem.contracts import ProducerReport, SchemaVersionError, producers_key

logger = logging.getLogger(__name__)


class ProducerStats:
    """Turns the run's :class:`ProducerReport` hash into step telemetry fields.

    Utilisation of a process over a step is the share of the step it had a
    rollout task running; the field is the mean over processes seen at both
    ends of the step. ``clock`` is injectable for tests.
    """

    def __init__(self, client: redis.Redis, run_id: int, clock=time.time):
        self._redis = client
        self._key = producers_key(run_id)
        self._clock = clock
        # worker -> (busy_s, uptime_s) at the previous step.
        self._previous: dict[str, tuple[float, float]] = {}
        # worker -> its report at the previous step, for the timings' differences.
        self._previous_reports: dict[str, ProducerReport] = {}
        self._open_reasons: dict[tuple[str, str], str] = {}

    def _reports(self) -> list[ProducerReport]:
        reports = []
        for raw in self._redis.hgetall(self._key).values():
            try:
                reports.append(ProducerReport.model_validate_json(raw))
            except (ValidationError, SchemaVersionError) as exc:
                logger.warning("ignoring an unreadable producer report: %s", exc)
        return reports

    def step_fields(self) -> dict:
        """``producer_utilisation``, ``producers_reporting`` and ``circuit_breakers_open`` for this step."""
        now = self._clock()
        reports = self._reports()
        shares = []
        # Each process's own figures, kept by the platform as series of their own (producer_metric_name).
        processes: dict[str, dict[str, float]] = {report.worker: {} for report in reports}
        for report in reports:
            busy, uptime = report.busy_and_uptime_at(now)
            previous = self._previous.get(report.worker)
            if previous is not None and uptime > previous[1]:
                shares.append(min(max((busy - previous[0]) / (uptime - previous[1]), 0.0), 1.0))
                processes[report.worker]["utilisation"] = shares[-1]
            self._previous[report.worker] = (busy, uptime)
        circuit_open: dict[str, int] = {}
        for report in reports:
            for environment, breaker in report.circuit_breakers.items():
                is_open = breaker.state != "closed"
                circuit_open[environment] = circuit_open.get(environment, 0) + int(is_open)
                key = (report.worker, environment)
                if is_open and key not in self._open_reasons:
                    logger.warning("producer %s paused episodes of %s: circuit open after %d failures, last: %s",
                                   report.worker, environment, breaker.consecutive_failures,
                                   breaker.last_failure_reason)
                    self._open_reasons[key] = breaker.last_failure_reason
                elif not is_open:
                    self._open_reasons.pop(key, None)
        return {
            "producer_utilisation": sum(shares) / len(shares) if shares else None,
            "producers_reporting": len(reports),
            "circuit_breakers_open": circuit_open,
            "producer_timings": self._timings(reports, processes),
            "producer_processes": {worker: figures for worker, figures in processes.items() if figures},
        }

    def _timings(self, reports: list[ProducerReport], processes: dict[str, dict[str, float]]) -> dict[str, float]:
        """Where producers' time went since the previous step, over processes seen at both ends.

        A producer's work time for the run is its episodes' time plus appending
        them to the stream; ``*_share`` are parts of that: generation, environment
        (reset/step), tools and ``stream_put`` (blocked on XADD: back-pressure).
        ``stream_put_s`` is those seconds, summed over processes; ``cpu_cores``
        and ``rss_bytes`` the processes' CPU use (cores) and resident memory, summed,
        and each process's own added to ``processes``.
        Reports are written at task boundaries, so a step without one has none of these.
        """
        deltas = {"episode_s": 0.0, "generation_s": 0.0, "environment_s": 0.0, "tool_s": 0.0, "stream_put_s": 0.0}
        cpu_cores = None
        rss_bytes = None
        changed = False
        for report in reports:
            if report.rss_bytes is not None:
                rss_bytes = (rss_bytes or 0) + report.rss_bytes
                processes[report.worker]["rss_bytes"] = float(report.rss_bytes)
            previous = self._previous_reports.get(report.worker)
            self._previous_reports[report.worker] = report
            if previous is None or report.reported_at <= previous.reported_at:
                continue
            changed = True
            for name in deltas:
                deltas[name] += max(getattr(report, name) - getattr(previous, name), 0.0)
            if report.cpu_s is not None and previous.cpu_s is not None:
                process_cores = max(report.cpu_s - previous.cpu_s, 0.0) / (report.reported_at - previous.reported_at)
                processes[report.worker]["cpu_cores"] = process_cores
                cpu_cores = (cpu_cores or 0.0) + process_cores
        timings: dict[str, float] = {}
        work_s = deltas["episode_s"] + deltas["stream_put_s"]
        if changed:
            timings["stream_put_s"] = deltas["stream_put_s"]
        if work_s > 0:
            for name in ("generation", "environment", "tool", "stream_put"):
                timings[f"{name}_share"] = deltas[f"{name}_s"] / work_s
        if cpu_cores is not None:
            timings["cpu_cores"] = cpu_cores
        if rss_bytes is not None:
            timings["rss_bytes"] = float(rss_bytes)
        return timings
