"""Committed checkpoints of a run, as the trainer reports them to the platform."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from tandem.contracts.schema import Record


class CheckpointInfo(BaseModel):
    """One committed Orbax checkpoint of a run, as the trainer sees it on disk."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step: int = Field(ge=0, description="Updates the checkpointed train state holds.")
    policy_version: int = Field(ge=-1, description="Newest policy version published when it was saved.")
    path: str = Field(min_length=1, description="The step directory on the shared filesystem.")
    size_bytes: int = Field(ge=0, description="Bytes of every file in the step directory.")


class CheckpointReport(Record):
    """Every committed checkpoint of a run now on disk; those missing from it were removed by retention."""

    checkpoints: list[CheckpointInfo]
