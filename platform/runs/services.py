"""Writes of runs: creation, the status lifecycle, and the trainer's claim and heartbeats."""

from __future__ import annotations

from typing import Any

import pydantic
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from accounts.models import Project
from accounts.permissions import project_require_writer
from domain_errors import Conflict, InvalidInput
from environments.models import EnvironmentVersion
from environments.selectors import environment_version_pin
from tandem.contracts import TrainerHeartbeat
from tandem.run_config import RunConfig

from .models import Run
from .realtime import run_broadcast_on_commit

Status = Run.Status

# The only status changes there are; anything else is refused with a Conflict.
LEGAL_TRANSITIONS: dict[str, frozenset[str]] = {
    Status.QUEUED: frozenset({Status.RUNNING, Status.CANCELLED, Status.FAILED}),
    Status.RUNNING: frozenset({Status.FINISHED, Status.FAILED, Status.CANCELLED}),
    Status.FINISHED: frozenset(),
    Status.FAILED: frozenset(),
    Status.CANCELLED: frozenset(),
}


def run_config_normalise(config: dict[str, Any] | None) -> dict[str, Any]:
    """``config`` validated against RunConfig, as JSON with every default filled in."""
    try:
        return RunConfig.model_validate(config or {}).model_dump(mode="json")
    except pydantic.ValidationError as error:
        raise InvalidInput.from_pydantic(error, prefix="config") from None


@transaction.atomic
def run_create(
    *,
    user: AbstractBaseUser,
    project: Project,
    environment_name: str,
    config: dict[str, Any] | None = None,
    name: str = "",
) -> Run:
    """Queue a run of ``environment_name`` (an environment of ``project``, or ``name@version``)."""
    project_require_writer(user=user, project=project)
    # `name` pins the latest version, `name@3` version 3; a failed probe is a Conflict.
    version = environment_version_pin(project=project, reference=environment_name)
    normalised = run_config_normalise(config)
    now = timezone.now()
    name = name.strip() or f"{version.environment.name}-{now:%Y%m%d-%H%M%S}"
    return Run.objects.create(
        project=project,
        environment=version.environment,
        environment_version=version,
        name=name,
        config=normalised,
        created_at=now,
    )


@transaction.atomic
def run_transition(*, run: Run, to_status: str, reason: str = "") -> Run:
    """Move ``run`` to ``to_status`` if LEGAL_TRANSITIONS allows it from its current status.

    The current status is read under a row lock, so two racing transitions (a
    user's cancel and the trainer's finish, say) cannot both win. ``run`` is
    updated in place and returned.
    """
    current = Run.objects.select_for_update().values_list("status", flat=True).get(pk=run.pk)
    run.status = current
    if to_status not in LEGAL_TRANSITIONS[current]:
        raise Conflict(f"Run {run.pk} is {current}; it cannot become {to_status}.")

    now = timezone.now()
    run.status = to_status
    run.status_reason = reason
    update_fields = ["status", "status_reason"]
    if to_status == Status.RUNNING:
        run.started_at = now
        update_fields.append("started_at")
    if to_status in Run.TERMINAL_STATUSES:
        run.finished_at = now
        update_fields.append("finished_at")
    run.save(update_fields=update_fields)

    run_broadcast_on_commit(run.pk, [_status_message(run)])
    return run


def run_cancel(*, user: AbstractBaseUser, run: Run) -> Run:
    project_require_writer(user=user, project=run.project)
    return run_transition(run=run, to_status=Status.CANCELLED, reason=f"Cancelled by {user}.")


@transaction.atomic
def run_claim_next(*, worker: str) -> Run | None:
    """Start the oldest queued run on behalf of trainer ``worker``; None if none is queued.

    SKIP LOCKED lets two trainers claim at once without waiting on, or taking,
    the same run.
    """
    run = (
        Run.objects.select_for_update(skip_locked=True)
        # A run waits while its environment version's probe is pending or it is unhealthy.
        .filter(status=Status.QUEUED, environment_version__status=EnvironmentVersion.Status.READY)
        .order_by("created_at", "id")
        .first()
    )
    if run is None:
        return None
    run_transition(run=run, to_status=Status.RUNNING)
    run.claimed_by = worker
    run.heartbeat_at = run.started_at
    run.save(update_fields=["claimed_by", "heartbeat_at"])
    return run


@transaction.atomic
def run_heartbeat(*, run: Run, heartbeat: TrainerHeartbeat) -> Run:
    """Record the trainer's progress and, when it says so, finish or fail the run.

    A run that already ended (a user cancelled it, say) is left as it is and
    returned, so the trainer reads the status and stops: cancel wins.
    """
    run = Run.objects.select_for_update().select_related("project").get(pk=run.pk)
    if run.is_terminal:
        return run
    if run.status == Status.QUEUED:
        raise Conflict(f"Run {run.pk} is queued; claim it before reporting on it.")

    run.heartbeat_at = timezone.now()
    # max(): a late heartbeat must not move progress back behind newer telemetry.
    run.policy_version = max(run.policy_version, heartbeat.policy_version)
    run.trainer_step = max(run.trainer_step, heartbeat.trainer_step)
    run.save(update_fields=["heartbeat_at", "policy_version", "trainer_step"])
    if heartbeat.status != Status.RUNNING:
        run_transition(run=run, to_status=heartbeat.status, reason=heartbeat.message)
    return run


def _status_message(run: Run) -> dict:
    return {
        "type": "status",
        "run": run.pk,
        "status": run.status,
        "status_reason": run.status_reason,
        "policy_version": run.policy_version,
        "trainer_step": run.trainer_step,
    }
