"""What became of the trajectories the trainer consumed, one decision per stream entry."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tandem.contracts.schema import StreamRecord


class LineageEntry(StreamRecord):
    """One decision of the trainer about consumed trajectories, appended to :func:`lineage_stream`.

    After a resume from a checkpoint the steps past it are trained again: the
    newest ``trained`` entry of a step is the one the surviving parameters went
    through, and across those entries no trajectory id appears twice.
    """

    kind: Literal["trained", "dropped", "lost"] = Field(
        description="trained: the update of `step` used them; dropped: consumed untrained (too stale, "
        "no reward variance under dynamic sampling, or surplus when the run ended); lost: groups given up on (their producer died)."
    )
    step: int = Field(description="Trainer step: the update's own for `trained`, the last one before otherwise.")
    policy_version: int = Field(description="Policy version published by the trainer at that point.")
    worker: str = Field(description="The trainer process (`hostname:pid`) that decided.")
    trajectory_ids: list[str] = Field(default_factory=list)
    group_ids: list[str] = Field(default_factory=list)
