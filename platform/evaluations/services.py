"""Writes of evaluations: the trainer's reports."""

from __future__ import annotations

from django.db import transaction

from runs.models import Run
from tandem.contracts import EvaluationReport
from telemetry.services import metric_points_record

from .models import Evaluation

#: Prefix of the run's metric series that hold its evaluations' metrics: ``eval/success_rate``.
EVALUATION_METRIC_PREFIX = "eval/"


@transaction.atomic
def evaluation_record(*, run: Run, report: EvaluationReport) -> tuple[Evaluation, bool]:
    """Store the report as the run's evaluation ``report.evaluation``; True if it is new.

    A retried post (the trainer posts again when it got no answer) updates the
    same evaluation. Its metrics also become the run's metric points at
    ``report.step``, named ``eval/<metric>``, so that they chart and read like
    the trainer's other series; stored again, a point replaces itself.
    """
    # Locked before the evaluation is written, in the order the telemetry posts lock
    # (the run, then its rows), and so that two posts of one evaluation take turns.
    run = Run.objects.select_for_update().get(pk=run.pk)
    evaluation, created = Evaluation.objects.update_or_create(
        run=run,
        index=report.evaluation,
        defaults={
            "step": report.step,
            "policy_version": report.policy_version,
            "environment": report.environment,
            "status": report.status,
            "reason": report.reason,
            "tasks": report.tasks,
            "samples_per_task": report.samples_per_task,
            "temperature": report.temperature,
            "episodes": report.episodes,
            "metrics": report.metrics,
            "intervals": {name: list(bounds) for name, bounds in report.intervals.items()},
            "trajectory_ids": report.trajectory_ids,
        },
    )
    metric_points_record(
        run=run,
        step=report.step,
        values={f"{EVALUATION_METRIC_PREFIX}{name}": value for name, value in report.metrics.items()},
    )
    return evaluation, created
