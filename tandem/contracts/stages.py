"""The trainer's stages: what each second of a trainer step was spent on, in the order a step runs them.

The trainer records them (``trainer/profiling.py``), the step event carries
them as a :class:`~tandem.contracts.StepTimeline` and as one metric per stage
(:func:`stage_metric_name`), and the dashboard draws them (its run page's
stage chart and the timeline are given this table as data).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

TrainerStage = Literal["data_wait", "batch", "host_to_device", "compute", "publish", "checkpoint", "telemetry",
                       "other"]

#: Version of the stage vocabulary and its meaning; a chart keyed by stage names can tell a change apart.
STAGE_TIMELINE_VERSION = 1


@dataclass(frozen=True)
class TrainerStageDefinition:
    name: TrainerStage
    meaning: str


#: Every stage, in the order a step runs them.
TRAINER_STAGES: tuple[TrainerStageDefinition, ...] = (
    TrainerStageDefinition("data_wait", "blocked on trajectories (RL) or demonstrations"),
    TrainerStageDefinition("batch", "building the padded batch on the host"),
    TrainerStageDefinition("host_to_device", "the batch's transfer, to block_until_ready"),
    TrainerStageDefinition(
        "compute", "the jitted train step to block_until_ready of its outputs. Forward, backward AND the "
        "optimizer update: the step is one fused XLA program; split into a gradient and an update program "
        "it ran 4-7% slower (CPU, nano model), so no separate optimizer stage is reported rather than a "
        "guessed one"),
    TrainerStageDefinition("publish", "serialising and publishing weights; at an evaluation point also keeping "
                           "the evaluated version for producers and scoring held-out dataset rows"),
    TrainerStageDefinition("checkpoint", "starting an (asynchronous) checkpoint save"),
    TrainerStageDefinition("telemetry", "step bookkeeping, posting telemetry and traces"),
    TrainerStageDefinition("other", "whatever lies between the stages above"),
)

#: The stage in which the trainer waits for data: its share of a step is the trainer's idle time.
IDLE_STAGE: TrainerStage = "data_wait"
#: The time of a step between the stages the trainer recorded.
UNRECORDED_STAGE: TrainerStage = "other"

if tuple(stage.name for stage in TRAINER_STAGES) != get_args(TrainerStage):
    raise AssertionError("TRAINER_STAGES and TrainerStage must list the same stages, in the same order")


def stage_metric_name(stage: str) -> str:
    """The metric of a step's seconds in ``stage``: ``stage/compute_s``."""
    return f"stage/{stage}_s"


def stage_meanings() -> str:
    """Every stage and its meaning, in one sentence per stage (the schema's description of a stage name)."""
    return "; ".join(f"{stage.name}: {stage.meaning}" for stage in TRAINER_STAGES) + "."
