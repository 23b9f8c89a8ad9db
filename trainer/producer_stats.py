"""Producer utilisation and circuit breakers, per trainer step, from the producers' own reports."""

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
        for report in reports:
            busy, uptime = report.busy_and_uptime_at(now)
            previous = self._previous.get(report.worker)
            if previous is not None and uptime > previous[1]:
                shares.append(min(max((busy - previous[0]) / (uptime - previous[1]), 0.0), 1.0))
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
        }
