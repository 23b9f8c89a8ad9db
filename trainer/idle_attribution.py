"""What the trainer waited on: each second of a wait for data, attributed to an environment and a cause.

When the trainer waits for a step's groups, the wait ends when the last
episode it needs arrives. That episode is on the wait's critical path: had it
been faster, the trainer would have waited less. So the wait
``[waited_from, waited_until]`` is laid over that episode's life and cut where
its phases begin and end (``tandem.contracts.IDLE_CAUSES``):

- before its group was requested: ``queue`` (the backlog and staleness bound held it back);
- from the request to the episode's start: ``capacity`` (its task waited for a free producer,
  or the episode for a slot of its environment);
- while it ran: ``generation``, ``environment`` and ``tool``, in the shares its timings give
  (its turns interleave them, so the share of the overlap is the honest split);
- from its end to the wait's end: ``queue`` (the stream, and assembling its group).

Wall-clock times from producers and the trainer are compared, so hosts' clocks are assumed
in step (NTP); a piece that a skew makes negative counts for nothing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from tandem.contracts import TrajectoryRecord


def _overlap(start: float, end: float, window_start: float, window_end: float) -> float:
    return max(0.0, min(end, window_end) - max(start, window_start))


def wait_attribution(*, waited_from: float, waited_until: float, critical: TrajectoryRecord,
                     requested_at: float | None) -> dict[str, float]:
    """Seconds of the wait by cause, from ``critical``, the episode whose arrival ended it.

    ``requested_at``: when its group was requested (unix time), if the trainer knows (it does not
    for groups an earlier trainer of the run requested: their time before the start counts as
    ``capacity``).
    """
    timings = critical.timings
    started, finished = timings.started_at, timings.finished_at
    requested = min(requested_at, started) if requested_at is not None else waited_from
    seconds: dict[str, float] = defaultdict(float)
    seconds["queue"] += _overlap(waited_from, requested, waited_from, waited_until)
    seconds["capacity"] += _overlap(requested, started, waited_from, waited_until)
    running = _overlap(started, finished, waited_from, waited_until)
    parts = {"generation": timings.generation_s, "environment": timings.environment_s, "tool": timings.tool_s}
    total = sum(max(0.0, value) for value in parts.values())
    if running > 0:
        if total <= 0:
            seconds["generation"] += running  # no timings: the policy is what an episode runs
        else:
            for cause, value in parts.items():
                seconds[cause] += running * max(0.0, value) / total
    seconds["queue"] += _overlap(max(finished, requested), waited_until, waited_from, waited_until)
    return {cause: value for cause, value in seconds.items() if value > 0}


class IdleAttribution:
    """The waits of one step (a step may wait more than once), by environment and cause."""

    def __init__(self) -> None:
        self._seconds: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))

    def waited(self, *, waited_from: float, waited_until: float, records: Sequence[TrajectoryRecord],
               requested_at: dict[str, float]) -> None:
        """A wait that ended once ``records`` (the groups it took) were all in; ``requested_at`` by group id."""
        if waited_until <= waited_from or not records:
            return
        critical = max(records, key=lambda record: record.timings.finished_at)
        for cause, seconds in wait_attribution(waited_from=waited_from, waited_until=waited_until,
                                               critical=critical,
                                               requested_at=requested_at.get(critical.group_id)).items():
            self._seconds[critical.environment][cause] += seconds

    def take(self) -> dict[str, dict[str, float]]:
        """The step's attribution (environment -> cause -> seconds), and a fresh start for the next."""
        taken = {environment: dict(causes) for environment, causes in self._seconds.items()}
        self._seconds.clear()
        return taken
