"""Writes of checkpoints: the trainer's reports, exports to safetensors, deletion."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from accounts.permissions import project_require_writer
from common.domain_errors import Conflict
from common.tasks import send_task
from runs.models import Run
from tandem.contracts import (
    CHECKPOINT_EXPORT,
    CHECKPOINT_EXPORT_QUEUED_S,
    CHECKPOINT_EXPORT_TIME_LIMIT_S,
    EXPORTS_QUEUE,
    CheckpointExportReport,
    CheckpointExportRequest,
    CheckpointExportStatus,
    CheckpointReport,
)

from .models import Checkpoint
from .selectors import checkpoint_path_in_root

logger = logging.getLogger(__name__)

# Inside the step directory, so retention (Orbax deletes the step directory) takes the export along.
EXPORT_SUBDIR = "safetensors"
# A request's time goes to the export worker and back as a float of unix seconds.
REQUESTED_AT_TOLERANCE_S = 1e-3
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
    """Queue a safetensors export of ``checkpoint`` for the export worker (sent when the transaction commits).

    The export loads JAX and may take an hour: it runs on the trainer side (trainer/export_worker.py,
    queue ``exports``), which reports back with :func:`checkpoint_export_record`.
    """
    project_require_writer(user=user, project=checkpoint.run.project)
    with transaction.atomic():
        checkpoint = Checkpoint.objects.select_for_update().select_related("run").get(pk=checkpoint.pk)
        _require_available(checkpoint)
        if checkpoint.export_status == Checkpoint.ExportStatus.EXPORTING:
            raise Conflict(f"Checkpoint of step {checkpoint.step} of run {checkpoint.run_id} is being exported.")
        checkpoint.export_status, checkpoint.export_error = Checkpoint.ExportStatus.EXPORTING, ""
        checkpoint.export_requested_at = timezone.now()
        checkpoint.save(update_fields=["export_status", "export_error", "export_requested_at"])
        request = checkpoint_export_request(checkpoint)
        transaction.on_commit(lambda: send_task(CHECKPOINT_EXPORT, request.model_dump(mode="json")))
    return checkpoint


def checkpoint_export_request(checkpoint: Checkpoint) -> CheckpointExportRequest:
    """What the export worker needs for ``checkpoint``: its run's config, where it is and where the export goes."""
    step_directory = Path(checkpoint.path)
    return CheckpointExportRequest(checkpoint_id=checkpoint.pk, run_config=checkpoint.run.config,
                                   run_directory=str(step_directory.parent), step=checkpoint.step,
                                   destination=str(step_directory / EXPORT_SUBDIR),
                                   requested_at=checkpoint.export_requested_at.timestamp())


def checkpoint_export_record(*, report: CheckpointExportReport) -> Checkpoint | None:
    """Record what the export worker reports of an export; None if the checkpoint is gone.

    A report of a checkpoint that is not being exported (deleted meanwhile, or a report sent twice), or
    of an earlier request than the newest (one that expired, then was asked for again), changes nothing;
    one naming another destination than the checkpoint's is recorded as failed.
    """
    with transaction.atomic():
        checkpoint = Checkpoint.objects.select_for_update().select_related("run").filter(
            pk=report.checkpoint_id).first()
        if checkpoint is None:
            logger.warning("export of checkpoint %s reported, but it no longer exists", report.checkpoint_id)
            return None
        if (checkpoint.status != Checkpoint.Status.AVAILABLE
                or checkpoint.export_status != Checkpoint.ExportStatus.EXPORTING):
            return checkpoint
        if abs(report.requested_at - checkpoint.export_requested_at.timestamp()) > REQUESTED_AT_TOLERANCE_S:
            logger.warning("checkpoint %s: an export requested at %s reported after a newer request; ignored",
                           checkpoint.pk, report.requested_at)
            return checkpoint
        expected = checkpoint_export_request(checkpoint).destination
        if report.destination != expected:
            checkpoint.export_status = Checkpoint.ExportStatus.FAILED
            checkpoint.export_error = (f"the export worker reported destination {report.destination!r}, "
                                       f"not the checkpoint's {expected!r}")
        elif report.status == CheckpointExportStatus.EXPORTED:
            checkpoint.export_status, checkpoint.export_path = Checkpoint.ExportStatus.EXPORTED, expected
        else:
            checkpoint.export_status, checkpoint.export_error = Checkpoint.ExportStatus.FAILED, report.error
        checkpoint.save(update_fields=["export_status", "export_path", "export_error"])
    return checkpoint


def checkpoint_exports_expire(*, now=None) -> int:
    """Fail the exports no export worker reported within its time limit and a queue wait (celery beat's
    sweep): none consumes the queue, or one was killed mid-export. Returns how many; a report that comes
    later changes nothing, and the user may export again."""
    waited_s = CHECKPOINT_EXPORT_TIME_LIMIT_S + CHECKPOINT_EXPORT_QUEUED_S
    cutoff = (now or timezone.now()) - timezone.timedelta(seconds=waited_s)
    return Checkpoint.objects.filter(
        export_status=Checkpoint.ExportStatus.EXPORTING, export_requested_at__lt=cutoff,
    ).update(export_status=Checkpoint.ExportStatus.FAILED, export_error=(
        f"No export worker reported this export within {waited_s} s: is `tandem export-worker` consuming "
        f"the '{EXPORTS_QUEUE}' queue?"))


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
