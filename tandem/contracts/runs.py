"""What a run is across processes: its statuses, the spec producers read, the trainer's heartbeat and its reply."""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from tandem.configs.run import RunConfig, upgrade_run_config
from tandem.contracts.environments import EnvironmentSpec
from tandem.contracts.schema import Record


class RunStatus(StrEnum):
    """Where a run is in its life; the platform's ``runs.services.LEGAL_TRANSITIONS`` says how it moves.

    queued: waiting for a trainer (and for its environment version to be ready);
    starting: a trainer claimed it and is building it; running: the trainer's first
    heartbeat came; paused: the trainer checkpointed and let go of it; finished,
    failed, cancelled: ended (a failed run can be resumed, and continues from its
    last checkpoint).
    """

    QUEUED = "queued"
    STARTING = "starting"
    RUNNING = "running"
    PAUSED = "paused"
    FINISHED = "finished"
    FAILED = "failed"
    CANCELLED = "cancelled"

    def __repr__(self) -> str:
        # The plain value, so that validation errors read "Input should be 'running', ...".
        return repr(self.value)

    @property
    def label(self) -> str:
        """How people see it: "Queued", "Running" ..."""
        return self.value.capitalize()

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_RUN_STATUSES


#: The run has ended: nothing trains it any more (a failed one may be resumed).
TERMINAL_RUN_STATUSES = frozenset({RunStatus.FINISHED, RunStatus.FAILED, RunStatus.CANCELLED})
#: A trainer holds the run and must keep sending heartbeats.
TRAINER_HELD_RUN_STATUSES = frozenset({RunStatus.STARTING, RunStatus.RUNNING})
#: The run is on its way to a trainer or with one: it can still make progress without a user's action.
ACTIVE_RUN_STATUSES = frozenset({RunStatus.QUEUED, *TRAINER_HELD_RUN_STATUSES})
#: Told one of these by a heartbeat reply, the trainer checkpoints and lets go of the run (a user can resume it).
RELEASED_RUN_STATUSES = frozenset({RunStatus.PAUSED, RunStatus.FAILED})
#: A user may cancel the run: it has not ended (the platform's LEGAL_TRANSITIONS let each of these become cancelled).
CANCELLABLE_RUN_STATUSES = frozenset(RunStatus) - TERMINAL_RUN_STATUSES


def run_status_choices() -> list[tuple[str, str]]:
    """``(value, label)`` of every status, in lifecycle order: the platform model's choices.

    A callable rather than a list, so that Django's migrations store a reference
    to it and a new status needs no migration of choices. Migrations import it as
    ``tandem.contracts.runs.run_status_choices``: it stays there.
    """
    return [(status.value, status.label) for status in RunStatus]


class RunSpec(Record):
    """What a producer needs to run episodes for a run; written by the trainer on claim.

    Schema 2: ``config`` is a sectioned RunConfig (schema 1 held the flat dict of
    RunConfig 1, which readers upgrade).
    """

    readable_schema_versions: ClassVar[frozenset[int]] = frozenset({1, 2})
    schema_version: int = 2
    run_id: int
    config: RunConfig = Field(description="The run's config, validated once, when the spec is read.")
    environment: EnvironmentSpec
    evaluation_environments: tuple[EnvironmentSpec, ...] = Field(
        (), description="The other environments it evaluates on (config.evaluation.environments, pinned).")

    def evaluation_environment(self, label: str) -> EnvironmentSpec | None:
        """The environment an evaluation request names by label ("": the run's own); None if it has none such."""
        if not label:
            return self.environment
        return next((environment for environment in self.evaluation_environments if environment.label == label),
                    None)

    @model_validator(mode="before")
    @classmethod
    def _upgrade(cls, data):
        # A spec an older trainer wrote holds an older config; readers upgrade it first.
        if isinstance(data, dict) and data.get("schema_version") == 1:
            data = {**data, "schema_version": 2}
        if isinstance(data, dict) and isinstance(data.get("config"), dict):
            data = {**data, "config": upgrade_run_config(data["config"])}
        return data


# The statuses a trainer may report; the others are the platform's or a user's to set. queued: the
# trainer cannot go on but the run can (a multi-process trainer lost one of its processes): the
# platform queues it again as a restart, counted against config.max_restarts, as it does a run whose
# trainer died, and fails it past them. A trainer that sets a run aside (the platform kept failing a
# read of the run's data) says so with queued and a retry_after_s, to be given other runs meanwhile.
RunReportedStatus = Literal[RunStatus.RUNNING, RunStatus.FINISHED, RunStatus.FAILED, RunStatus.QUEUED]


# The longest a trainer may set a run aside for: a day. A longer wait is a pause, the user's to ask.
RETRY_AFTER_MAX_S = 86_400.0


class TrainerHeartbeat(Record):
    """Liveness and progress the trainer reports for a run it owns."""

    # None: liveness only. The trainer process beats from a thread of its own, so
    # a long compile or checkpoint is never mistaken for a dead trainer.
    status: RunReportedStatus | None = RunStatus.RUNNING
    policy_version: int = 0
    trainer_step: int = 0
    message: str = ""
    # Who sends it (``hostname:pid``): a trainer that lost the run to another
    # (it was presumed dead and the run resumed elsewhere) is told so and stops.
    worker: str = ""
    # Added within schema 1: optional, and a heartbeat without it reads as before.
    retry_after_s: float | None = Field(
        None, ge=0, le=RETRY_AFTER_MAX_S,
        description="With status queued: no trainer claims the run again for this many seconds, so that "
        "the trainer that set it aside (the platform kept failing a read of its data) trains other runs "
        "meanwhile. Ignored with any other status.",
    )


class TrainerHeartbeatReply(Record):
    """The platform's answer to a :class:`TrainerHeartbeat`: the run's status as it now stands."""

    status: RunStatus = Field(
        description="cancelled: stop; paused or failed (RELEASED_RUN_STATUSES): checkpoint and let go "
        "of the run; any other: train on."
    )
