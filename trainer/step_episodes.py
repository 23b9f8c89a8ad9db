"""What became of every episode a step consumed: the producer half of the platform's timeline.

Cheap by design: one small :class:`EpisodeSpan` per episode, built from fields
the record already has (no token is looked at), a few microseconds each.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from tandem.contracts import EpisodeSpan, TrajectoryRecord


class StepEpisodes:
    """Collects the episodes consumed since the last step event; :meth:`take` hands them to the event.

    Episodes consumed in an iteration that trained nothing (dynamic sampling
    dropped every group) stay here and go out with the next step's event, as
    its stages do.
    """

    def __init__(self) -> None:
        self._spans: list[EpisodeSpan] = []

    def __len__(self) -> int:
        return len(self._spans)

    def dropped(self, records: Iterable[TrajectoryRecord], *,
                outcome: Literal["dropped_stale", "dropped_incomplete"]) -> None:
        """``records`` were consumed without reaching the algorithm."""
        self._spans.extend(EpisodeSpan.from_record(record, outcome=outcome) for record in records)

    def consumed(self, records: Iterable[TrajectoryRecord], *, trained: Iterable[TrajectoryRecord]) -> None:
        """``records`` went to the algorithm; ``trained`` are those it kept for the update.

        A failed episode is never trained (fully masked, outside its group's
        baseline); a successful one the algorithm did not keep was filtered
        out with its group (dynamic sampling).
        """
        kept = {id(record) for record in trained}
        for record in records:
            if record.status == "failed":
                outcome = "failed"
            elif id(record) in kept:
                outcome = "trained"
            else:
                outcome = "dropped_filtered"
            self._spans.append(EpisodeSpan.from_record(record, outcome=outcome))

    def take(self) -> list[EpisodeSpan]:
        spans, self._spans = self._spans, []
        return spans
