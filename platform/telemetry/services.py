"""Writes of telemetry: the trainer's step events, and trace requests and uploads."""

from __future__ import annotations

import math
from collections.abc import Sequence

from django.contrib.auth.models import AbstractBaseUser
from django.core.files.uploadedfile import UploadedFile
from django.db import transaction
from django.utils import timezone

from accounts.permissions import project_require_writer
from domain_errors import Conflict, InvalidInput
from runs.models import Run
from runs.realtime import run_broadcast_on_commit
from tandem.contracts import TrainerStepEvent

from .models import DeviceSnapshot, MetricPoint, Trace

# A trace of many steps is large (every kernel of every step) and slows those steps.
MAX_TRACE_STEPS = 100


@transaction.atomic
def metric_events_record(*, run: Run, events: Sequence[TrainerStepEvent]) -> int:
    """Store the events' metric values and tell the run's open pages about them.

    Storing is idempotent: a retried post of the same events stores nothing new
    and returns the same count. The run's progress moves forward only while it
    runs; events arriving after a cancel are kept but do not revive it.
    Returns the number of metric points the events carry.

    JSON has no NaN or infinity, so a non-finite value (a diverged loss) is
    neither stored nor sent: the chart shows a gap at that step.
    """
    for index, event in enumerate(events):
        if event.run_id != run.pk:
            raise InvalidInput.for_field(
                f"events.{index}.run_id",
                f"Event is for run {event.run_id}, posted to run {run.pk}.",
            )
    if not events:
        return 0

    now = timezone.now()
    values_by_event = [
        (event, _finite_values(event)) for event in sorted(events, key=lambda e: e.step)
    ]
    points = [
        MetricPoint(run=run, step=event.step, name=name, value=value, recorded_at=now)
        for event, values in values_by_event
        for name, value in values.items()
    ]
    # A trainer resumed from a checkpoint trains the steps after it again: the
    # newest value of a step is the one its surviving parameters went through.
    MetricPoint.objects.bulk_create(
        points, update_conflicts=True, unique_fields=["run", "name", "step"],
        update_fields=["value", "recorded_at"], batch_size=1000,
    )

    with_devices = [event for event in events if event.device is not None]
    if with_devices:
        # Newest by the trainer's clock, not by step: a resumed trainer trains earlier steps again.
        newest = max(with_devices, key=lambda event: event.device.reported_at)
        _device_snapshot_store(run=run, step=newest.step, report=newest.device.model_dump(mode="json"), now=now)

    run = Run.objects.select_for_update().get(pk=run.pk)
    if run.status == Run.Status.RUNNING:
        run.trainer_step = max(run.trainer_step, max(event.step for event in events))
        run.policy_version = max(run.policy_version, max(event.policy_version for event in events))
        run.heartbeat_at = now
        run.save(update_fields=["trainer_step", "policy_version", "heartbeat_at"])

    run_broadcast_on_commit(
        run.pk,
        [
            {
                "type": "metrics",
                "run": run.pk,
                "step": event.step,
                "phase": event.phase,
                "values": values,
                "status": run.status,
                "policy_version": event.policy_version,
            }
            for event, values in values_by_event
        ],
    )
    return len(points)


def _device_snapshot_store(*, run: Run, step: int, report: dict, now) -> None:
    snapshot = DeviceSnapshot.objects.select_for_update().filter(run=run).first()
    if snapshot is None:
        DeviceSnapshot.objects.create(run=run, step=step, report=report, recorded_at=now)
    elif snapshot.report.get("reported_at", 0.0) <= report["reported_at"]:
        snapshot.step, snapshot.report, snapshot.recorded_at = step, report, now
        snapshot.save(update_fields=["step", "report", "recorded_at"])


def _finite_values(event: TrainerStepEvent) -> dict[str, float]:
    return {name: value for name, value in event.metric_values().items() if math.isfinite(value)}


@transaction.atomic
def trace_request(*, user: AbstractBaseUser, run: Run, steps: int) -> Trace:
    """Ask the run's trainer for a jax.profiler trace of its next ``steps`` steps.

    The trainer learns of it in the reply to its next telemetry post. A run
    that will never train again (finished or cancelled) cannot be traced.
    """
    project_require_writer(user=user, project=run.project)
    if not 1 <= steps <= MAX_TRACE_STEPS:
        raise InvalidInput.for_field("steps", f"Must be between 1 and {MAX_TRACE_STEPS}.")
    if run.status in {Run.Status.FINISHED, Run.Status.CANCELLED}:
        raise Conflict(f"Run {run.pk} is {run.status}: it has no next steps to trace.")
    return Trace.objects.create(run=run, steps=steps, requested_by=user)


@transaction.atomic
def trace_upload(*, run: Run, trace_id: int, first_step: int, last_step: int,
                 file: UploadedFile | None, error: str = "") -> Trace:
    """Store the trainer's trace of a request (or, with no file, why it could not take one)."""
    trace = Trace.objects.select_for_update().filter(run=run, pk=trace_id).first()
    if trace is None:
        raise InvalidInput.for_field("trace", f"Run {run.pk} has no trace request {trace_id}.")
    if trace.status != Trace.Status.REQUESTED:
        raise Conflict(f"Trace {trace_id} of run {run.pk} is already {trace.status}.")
    if file is None and not error:
        raise InvalidInput.for_field("file", "Upload the zipped trace, or say in 'error' why there is none.")
    trace.first_step, trace.last_step = first_step, last_step
    trace.captured_at = timezone.now()
    if file is None:
        trace.status, trace.error = Trace.Status.FAILED, error
    else:
        trace.status, trace.size_bytes = Trace.Status.CAPTURED, file.size
        trace.file.save(f"trace-{trace.pk}.zip", file, save=False)
    trace.save()
    return trace
