"""Committed checkpoints of a run, as the trainer reports them to the platform, and their exports."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tandem.contracts.schema import Record


class CheckpointInfo(BaseModel):
    """One committed Orbax checkpoint of a run, as the trainer sees it on disk."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step: int = Field(ge=0, description="Updates the checkpointed train state holds.")
    policy_version: int = Field(ge=-1, description="Newest policy version published when it was saved.")
    path: str = Field(min_length=1, description="The step directory on the shared filesystem.")
    size_bytes: int = Field(ge=0, description="Bytes of every file in the step directory.")


class CheckpointStatus(StrEnum):
    """Whether a checkpoint's files are on disk; a deleted one stays listed, with why it went."""

    AVAILABLE = "available"
    DELETED = "deleted"


class CheckpointExportStatus(StrEnum):
    """Where a checkpoint's safetensors export stands, as the platform records it."""

    NONE = "none"
    EXPORTING = "exporting"
    EXPORTED = "exported"
    FAILED = "failed"


class CheckpointReport(Record):
    """Every committed checkpoint of a run now on disk; those missing from it were removed by retention."""

    checkpoints: list[CheckpointInfo]


#: Seconds an export may run on the export worker (its hard time limit; the soft one is a minute less, and
#: fails the export with that reason). The platform fails an export unreported for longer than this plus
#: CHECKPOINT_EXPORT_QUEUED_S (no export worker, or one killed mid-export).
CHECKPOINT_EXPORT_TIME_LIMIT_S = 3600
CHECKPOINT_EXPORT_QUEUED_S = 600


class CheckpointExportRequest(Record):
    """A safetensors export the platform asks of the export worker (the argument of CHECKPOINT_EXPORT).

    It carries all the export needs, so the worker needs neither the database nor the platform's API:
    the run's config (the train state's structure) and where the step is and the export goes.
    """

    checkpoint_id: int
    run_config: dict = Field(description="The run's config as the platform stored it.")
    run_directory: str = Field(min_length=1, description="The run's checkpoint directory (the step's parent).")
    step: int = Field(ge=0)
    destination: str = Field(min_length=1, description="The directory the Hugging Face files go to.")
    requested_at: float = Field(description="When the platform asked for this export (unix seconds); the report "
                                "says it again, so a late report of an export given up on is never taken for the "
                                "outcome of one asked for since.")


class CheckpointExportReport(Record):
    """An export's outcome, sent back to the platform as the argument of CHECKPOINT_EXPORT_REPORT."""

    checkpoint_id: int
    status: Literal[CheckpointExportStatus.EXPORTED, CheckpointExportStatus.FAILED]
    destination: str = Field(min_length=1, description="The request's destination, as asked.")
    requested_at: float = Field(description="The request's requested_at, as asked.")
    files: tuple[str, ...] = Field((), description="Names of the written files, in the destination.")
    size_bytes: int = Field(0, ge=0, description="Bytes of the written files.")
    error: str = Field("", description="Why it failed: the exception's type and message.")
    worker: str = Field("", description="`hostname:pid` of the export worker.")
    started_at: float
    finished_at: float
