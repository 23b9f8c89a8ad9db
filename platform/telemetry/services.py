"""Writes of telemetry: the trainer's step events."""

from __future__ import annotations

import math
from collections.abc import Sequence

from django.db import transaction
from django.utils import timezone

from domain_errors import InvalidInput
from runs.models import Run
from runs.realtime import run_broadcast_on_commit
from tandem.contracts import TrainerStepEvent

from .models import MetricPoint


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


def _finite_values(event: TrainerStepEvent) -> dict[str, float]:
    return {name: value for name, value in event.metric_values().items() if math.isfinite(value)}
