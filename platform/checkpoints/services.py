"""Writes of checkpoints: the trainer's reports, exports to safetensors, deletion."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from celery import current_app as celery_app
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from accounts.permissions import project_require_writer
from common.domain_errors import Conflict
from runs.models import Run
from tandem.contracts import PLATFORM_QUEUE, CheckpointReport

from .models import Checkpoint
from .selectors import checkpoint_path_in_root

logger = logging.getLogger(__name__)

EXPORT_TASK_NAME = "tandem.platform.export_checkpoint"
# Inside the step directory, so retention (Orbax deletes the step directory) takes the export along.
EXPORT_SUBDIR = "safetensors"
RETENTION_REASON = "retention"
# Resuming needs the newest checkpoint of a run that may still train.
RESUMABLE_STATUSES = frozenset({Run.Status.STARTING, Run.Status.RUNNING, Run.Status.PAUSED})


@transaction.atomic
def checkpoints_report(*, run: Run, report: CheckpointReport) -> list[Checkpoint]:
    """Record the run's committed checkpoints; available ones missing from the report were removed by retention.

    Returns the run's available checkpoints, newest first.
    """
    Run.objects.select_for_update().filter(pk=run.pk).first()  # one report of a run at a time
    existing = {checkpoint.step: checkpoint for checkpoint in Checkpoint.objects.filter(run=run)}
    reported = {info.step for info in report.checkpoints}
    for info in report.checkpoints:
        checkpoint = existing.get(info.step)
        if checkpoint is None:
            Checkpoint.objects.create(run=run, step=info.step, policy_version=info.policy_version,
                                      path=info.path, size_bytes=info.size_bytes)
        elif checkpoint.status == Checkpoint.Status.AVAILABLE:
            Checkpoint.objects.filter(pk=checkpoint.pk).update(
                policy_version=info.policy_version, path=info.path, size_bytes=info.size_bytes)
    Checkpoint.objects.filter(run=run, status=Checkpoint.Status.AVAILABLE).exclude(step__in=reported).update(
        status=Checkpoint.Status.DELETED, deleted_reason=RETENTION_REASON, deleted_at=timezone.now())
    return list(Checkpoint.objects.filter(run=run, status=Checkpoint.Status.AVAILABLE).order_by("-step"))


def _require_available(checkpoint: Checkpoint) -> None:
    if checkpoint.status != Checkpoint.Status.AVAILABLE:
        raise Conflict(f"Checkpoint of step {checkpoint.step} of run {checkpoint.run_id} is deleted "
                       f"({checkpoint.deleted_reason}).")


def checkpoint_export_start(*, user: AbstractBaseUser, checkpoint: Checkpoint) -> Checkpoint:
    """Queue a safetensors export of ``checkpoint`` on the platform worker (sent when the transaction commits)."""
    project_require_writer(user=user, project=checkpoint.run.project)
    with transaction.atomic():
        checkpoint = Checkpoint.objects.select_for_update().get(pk=checkpoint.pk)
        _require_available(checkpoint)
        if checkpoint.export_status == Checkpoint.ExportStatus.EXPORTING:
            raise Conflict(f"Checkpoint of step {checkpoint.step} of run {checkpoint.run_id} is being exported.")
        checkpoint.export_status, checkpoint.export_error = Checkpoint.ExportStatus.EXPORTING, ""
        checkpoint.save(update_fields=["export_status", "export_error"])
        transaction.on_commit(lambda: _export_send(checkpoint.pk))
    return checkpoint


def _export_send(checkpoint_id: int) -> None:
    celery_app.send_task(EXPORT_TASK_NAME, args=[checkpoint_id], queue=PLATFORM_QUEUE)


def checkpoint_export_run(*, checkpoint_id: int) -> Checkpoint:
    """Do a queued export (the platform worker's task): restore the step and write safetensors next to it."""
    checkpoint = Checkpoint.objects.select_related("run").get(pk=checkpoint_id)
    if checkpoint.status != Checkpoint.Status.AVAILABLE or checkpoint.export_status != Checkpoint.ExportStatus.EXPORTING:
        return checkpoint
    # jax and the model code load only in the process that exports.
    from trainer.checkpoint_export import export_checkpoint

    step_directory = Path(checkpoint.path)
    destination = step_directory / EXPORT_SUBDIR
    try:
        export_checkpoint(checkpoint.run.config, run_directory=step_directory.parent, step=checkpoint.step,
                          destination=destination)
    except Exception as exc:  # any failure is the export's outcome, shown to the user
        logger.exception("export of checkpoint %s failed", checkpoint_id)
        fields = {"export_status": Checkpoint.ExportStatus.FAILED, "export_error": f"{type(exc).__name__}: {exc}"}
    else:
        fields = {"export_status": Checkpoint.ExportStatus.EXPORTED, "export_path": str(destination)}
    # A checkpoint deleted meanwhile stays deleted.
    Checkpoint.objects.filter(pk=checkpoint_id, status=Checkpoint.Status.AVAILABLE).update(**fields)
    checkpoint.refresh_from_db()
    return checkpoint


def checkpoint_delete(*, user: AbstractBaseUser, checkpoint: Checkpoint) -> Checkpoint:
    """Delete the checkpoint's files and mark it deleted; the newest one of a resumable run is refused."""
    run = checkpoint.run
    project_require_writer(user=user, project=run.project)
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run.pk)
        checkpoint = Checkpoint.objects.select_for_update().get(pk=checkpoint.pk)
        _require_available(checkpoint)
        newest = Checkpoint.objects.filter(run=run, status=Checkpoint.Status.AVAILABLE).order_by("-step").first()
        if run.status in RESUMABLE_STATUSES and newest is not None and newest.pk == checkpoint.pk:
            raise Conflict(f"Checkpoint of step {checkpoint.step} is the newest of run {run.pk}, which is "
                           f"{run.status}: resuming needs it.")
        if checkpoint_path_in_root(run_id=run.pk, path=checkpoint.path):
            shutil.rmtree(checkpoint.path, ignore_errors=True)
        else:  # reported before paths were checked: never delete outside the checkpoint root
            logger.error("checkpoint %s: %s is outside the checkpoint root; its files are left",
                         checkpoint.pk, checkpoint.path)
        checkpoint.status = Checkpoint.Status.DELETED
        checkpoint.deleted_reason = f"deleted by {user.get_username()}"
        checkpoint.deleted_at = timezone.now()
        checkpoint.save(update_fields=["status", "deleted_reason", "deleted_at"])
    return checkpoint
