"""Circuit breakers: stop dispatching episodes to an environment that keeps failing.

One breaker per environment name, per producer process. After
``failure_threshold`` consecutive episodes failed by the environment, the
breaker opens: for ``cooldown_s`` new episodes of that environment fail at
once with a reason starting ``circuit open:`` instead of waiting on timeouts.
After the cool-down it is half-open: one probe episode is let through; its
success closes the breaker, its failure opens it for another cool-down.

Only environment faults count. A generation failure says nothing about the
environment, so it neither opens nor closes a breaker.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

BreakerState = Literal["closed", "open", "half_open"]

DEFAULT_FAILURE_THRESHOLD = 5
DEFAULT_COOLDOWN_S = 30.0


@dataclass
class _Breaker:
    consecutive_failures: int = 0
    opened_at: float | None = None
    last_failure_reason: str = ""
    probe_in_flight: bool = False


class CircuitBreakers:
    """Breakers of every environment a process runs, keyed by environment name.

    Thread-safe: producers may run episodes of several runs in threads.
    ``clock`` is injectable so tests need not sleep through a cool-down.
    """

    def __init__(self, *, failure_threshold: int = DEFAULT_FAILURE_THRESHOLD,
                 cooldown_s: float = DEFAULT_COOLDOWN_S, clock: Callable[[], float] = time.time):
        if failure_threshold < 1:
            raise ValueError("failure_threshold must be at least 1")
        if cooldown_s < 0:
            raise ValueError("cooldown_s must not be negative")
        self.failure_threshold = failure_threshold
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._breakers: dict[str, _Breaker] = {}
        self._lock = threading.Lock()

    def _state(self, breaker: _Breaker) -> BreakerState:
        if breaker.opened_at is None:
            return "closed"
        if self._clock() - breaker.opened_at < self.cooldown_s:
            return "open"
        return "half_open"

    def admit(self, environment: str) -> str | None:
        """None when an episode of ``environment`` may run, else why it must fail fast."""
        with self._lock:
            breaker = self._breakers.setdefault(environment, _Breaker())
            state = self._state(breaker)
            if state == "closed":
                return None
            if state == "half_open" and not breaker.probe_in_flight:
                breaker.probe_in_flight = True
                return None
            remaining = max(0.0, breaker.opened_at + self.cooldown_s - self._clock())
            waiting = "a probe episode is running" if state == "half_open" else f"retrying in {remaining:.0f}s"
            return (f"circuit open: {breaker.consecutive_failures} consecutive failed episodes of "
                    f"{environment!r}, last: {breaker.last_failure_reason}; {waiting}")

    def record_success(self, environment: str) -> None:
        with self._lock:
            self._breakers[environment] = _Breaker()

    def record_failure(self, environment: str, reason: str) -> None:
        with self._lock:
            breaker = self._breakers.setdefault(environment, _Breaker())
            breaker.consecutive_failures += 1
            breaker.last_failure_reason = reason
            if breaker.probe_in_flight or breaker.consecutive_failures >= self.failure_threshold:
                breaker.opened_at = self._clock()
            breaker.probe_in_flight = False

    def release_probe(self, environment: str) -> None:
        """An admitted episode ended without a verdict on the environment (e.g. generation failed)."""
        with self._lock:
            breaker = self._breakers.get(environment)
            if breaker is not None:
                breaker.probe_in_flight = False

    def states(self) -> dict[str, dict]:
        """``{environment: {"state", "consecutive_failures", "opened_at", "last_failure_reason"}}``."""
        with self._lock:
            return {
                name: {
                    "state": self._state(breaker),
                    "consecutive_failures": breaker.consecutive_failures,
                    "opened_at": breaker.opened_at,
                    "last_failure_reason": breaker.last_failure_reason,
                }
                for name, breaker in self._breakers.items()
            }


def breakers_from_environ(environ: Mapping[str, str]) -> CircuitBreakers:
    """Breakers set by ``TANDEM_CIRCUIT_FAILURE_THRESHOLD`` and ``TANDEM_CIRCUIT_COOLDOWN_S``.

    Worker settings rather than run config: a breaker protects a process from
    an environment, whichever run happens to use it.
    """
    return CircuitBreakers(
        failure_threshold=int(environ.get("TANDEM_CIRCUIT_FAILURE_THRESHOLD", DEFAULT_FAILURE_THRESHOLD)),
        cooldown_s=float(environ.get("TANDEM_CIRCUIT_COOLDOWN_S", DEFAULT_COOLDOWN_S)),
    )


#: The breakers of this producer process; ``run_episode`` uses them unless given others.
process_breakers = breakers_from_environ(os.environ)


def circuit_breaker_states() -> dict[str, dict]:
    """States of this process's breakers, e.g. for a worker heartbeat or a health endpoint."""
    return process_breakers.states()
