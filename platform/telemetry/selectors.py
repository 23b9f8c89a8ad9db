"""Reads of metric points."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from django.db.models import QuerySet

from domain_errors import NotFound
from runs.models import Run
from tandem.contracts import TraceRequest

from .models import DeviceSnapshot, MetricPoint, Trace


@dataclass(frozen=True)
class MetricPage:
    points: list[tuple[int, str, float]]  # (step, name, value), ordered by step then name
    next_after_step: int | None  # the last step in ``points``; None when it is empty


def metric_points_after(
    *, run: Run, after_step: int, names: Sequence[str] | None = None, limit: int = 1000
) -> MetricPage:
    """Points of the steps after ``after_step``, about ``limit`` of them, whole steps only.

    A page never ends inside a step, so a client that asks again from
    ``next_after_step`` misses nothing. A single step with more than ``limit``
    points comes whole rather than not at all.
    """
    points = MetricPoint.objects.filter(run=run, step__gt=after_step)
    if names:
        points = points.filter(name__in=names)
    rows = list(points.order_by("step", "name").values_list("step", "name", "value")[: limit + 1])
    if len(rows) > limit:
        first_step_left_out = rows[limit][0]
        whole_steps = [row for row in rows[:limit] if row[0] != first_step_left_out]
        if whole_steps:
            rows = whole_steps
        else:
            rows = list(
                points.filter(step=first_step_left_out)
                .order_by("name")
                .values_list("step", "name", "value")
            )
    return MetricPage(points=rows, next_after_step=rows[-1][0] if rows else None)


def trace_list(*, run: Run) -> QuerySet[Trace]:
    """The run's trace requests and traces, newest first."""
    return Trace.objects.filter(run=run).order_by("-requested_at", "-id")


def trace_get(*, run: Run, trace_id: int) -> Trace:
    trace = Trace.objects.filter(run=run, pk=trace_id).first()
    if trace is None:
        raise NotFound(f"Trace {trace_id} of run {run.pk} not found.")
    return trace


def trace_requests_pending(*, run: Run) -> list[TraceRequest]:
    """What the trainer of ``run`` should trace next, oldest request first."""
    pending = Trace.objects.filter(run=run, status=Trace.Status.REQUESTED).order_by("requested_at", "id")
    return [TraceRequest(id=trace.pk, steps=trace.steps) for trace in pending]


def device_snapshot_get(*, run: Run) -> DeviceSnapshot:
    snapshot = DeviceSnapshot.objects.filter(run=run).first()
    if snapshot is None:
        raise NotFound(f"Run {run.pk} has no device report yet.")
    return snapshot
