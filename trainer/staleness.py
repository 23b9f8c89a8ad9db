"""Bounded staleness at consumption, and the staleness records of each step.

Staleness of a trajectory is ``trainer policy version - record.policy_version``
(the oldest version that generated any of its tokens), measured against the
version the update starts from. It splits into two parts that have different
fixes:

- in flight: versions published while the episode was being generated
  (``newest - oldest`` version that generated its tokens); long multi-turn
  episodes and slow environments raise it.
- in queue: versions published after its last generated token, while it waited in
  the stream and the assembler (``trainer version - newest``);
  a deep backlog raises it. The seconds from the episode's end to its
  consumption are recorded too.

GRPO drops whole groups, never single episodes: the advantage baseline is the
group's mean reward, and a group with some members removed would bias it (and
break the fixed group size the batch is padded to). A group is stale when any
member is older than the bound, so every episode trained on is within it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Sequence

from tandem.contracts import TrajectoryRecord
from trainer.stream import StreamEntry

# Histogram buckets beyond this are pooled, so a telemetry event stays small.
_MAX_BUCKET = 64


def staleness(record: TrajectoryRecord, *, policy_version: int) -> int:
    """Versions between the oldest policy that wrote ``record`` and ``policy_version``."""
    return policy_version - record.policy_version


def in_flight_versions(record: TrajectoryRecord) -> int:
    """Versions published while the episode was generated."""
    return record.newest_version() - record.policy_version


def in_queue_versions(record: TrajectoryRecord, *, policy_version: int) -> int:
    """Versions published after the episode's last generated token."""
    return policy_version - record.newest_version()


def is_stale_group(entries: Sequence[StreamEntry], *, policy_version: int, max_staleness: int | None) -> bool:
    """Whether any episode of the group is more than ``max_staleness`` versions old (None: no bound)."""
    if max_staleness is None:
        return False
    return any(staleness(e.record, policy_version=policy_version) > max_staleness for e in entries)


def split_stale_groups(
    groups: Iterable[list[StreamEntry]], *, policy_version: int, max_staleness: int | None
) -> tuple[list[list[StreamEntry]], list[list[StreamEntry]]]:
    """``(fresh, stale)``: groups within the bound, and whole groups to drop before the loss."""
    fresh, stale = [], []
    for group in groups:
        stale_group = is_stale_group(group, policy_version=policy_version, max_staleness=max_staleness)
        (stale if stale_group else fresh).append(group)
    return fresh, stale


def _bucket(value: int) -> str:
    return str(value) if value < _MAX_BUCKET else f"{_MAX_BUCKET}+"


def _histogram(values: Iterable[int]) -> dict[str, int]:
    """Count per bucket, in bucket order. Negative values (data from a newer policy than
    a trainer restored from an older checkpoint) count as 0."""
    counts = Counter(min(max(value, 0), _MAX_BUCKET) for value in values)
    return {_bucket(value): count for value, count in sorted(counts.items())}


class StalenessRecorder:
    """Accumulates a step's staleness records; :meth:`step_fields` hands them out and starts over.

    The keys of :meth:`step_fields` are fields of ``TrainerStepEvent``.
    """

    def __init__(self) -> None:
        self._total: list[int] = []
        self._in_queue: list[int] = []
        self._in_flight: list[int] = []
        self._queue_wait_s: list[float] = []
        self._dropped_trajectories = 0
        self._dropped_groups = 0

    def trained(self, records: Iterable[TrajectoryRecord], *, policy_version: int,
                consumed_at: float | None = None) -> None:
        """Record trajectories that reach the loss. ``consumed_at``: unix time, default now."""
        consumed_at = time.time() if consumed_at is None else consumed_at
        for record in records:
            self._total.append(staleness(record, policy_version=policy_version))
            self._in_queue.append(in_queue_versions(record, policy_version=policy_version))
            self._in_flight.append(in_flight_versions(record))
            self._queue_wait_s.append(max(consumed_at - record.timings.finished_at, 0.0))

    def dropped(self, groups: Iterable[Sequence[StreamEntry]]) -> None:
        """Record whole groups dropped for staleness."""
        for group in groups:
            self._dropped_groups += 1
            self._dropped_trajectories += len(group)

    def step_fields(self) -> dict:
        """This step's records as ``TrainerStepEvent`` keyword arguments; resets the recorder."""
        trained = len(self._total)
        considered = trained + self._dropped_trajectories
        fields = {
            "staleness_histogram": _histogram(self._total),
            "staleness_in_queue_histogram": _histogram(self._in_queue),
            "staleness_in_flight_histogram": _histogram(self._in_flight),
            "queue_wait_s_mean": sum(self._queue_wait_s) / trained if trained else None,
            "queue_wait_s_max": max(self._queue_wait_s) if trained else None,
            "stale_trajectories_dropped": self._dropped_trajectories,
            "stale_groups_dropped": self._dropped_groups,
            "stale_drop_rate": self._dropped_trajectories / considered if considered else None,
        }
        self.__init__()
        return fields


def scalar_metrics(fields: dict) -> dict[str, float]:
    """:meth:`StalenessRecorder.step_fields` as flat finite series (``staleness/...``).

    For ``TrainerStepEvent.algorithm_metrics`` while the platform charts only
    ``metric_values()``; histogram buckets become ``staleness/<kind>/<bucket>`` counts.
    """
    metrics: dict[str, float] = {}
    for kind in ("", "in_queue_", "in_flight_"):
        for bucket, count in fields[f"staleness_{kind}histogram"].items():
            metrics[f"staleness/{kind.rstrip('_') or 'total'}/{bucket}"] = float(count)
    for name in ("queue_wait_s_mean", "queue_wait_s_max", "stale_drop_rate"):
        if fields[name] is not None:
            metrics[f"staleness/{name}"] = float(fields[name])
    metrics["staleness/stale_trajectories_dropped"] = float(fields["stale_trajectories_dropped"])
    metrics["staleness/stale_groups_dropped"] = float(fields["stale_groups_dropped"])
    return metrics
