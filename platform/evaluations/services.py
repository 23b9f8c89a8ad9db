"""Writes of evaluations: the trainer's reports, and evaluation-only runs of a kept checkpoint."""

from __future__ import annotations

from typing import Any

import pydantic
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from checkpoints.models import Checkpoint
from common.domain_errors import InvalidInput
from runs.models import Run
from runs.services import run_clone
from tandem.configs.evaluation import EvaluationConfig
from tandem.contracts import EVALUATION_METRIC_PREFIX, METRIC_NAME_LENGTH_MAX, EvaluationReport
from telemetry.services import metric_points_record

from .models import Evaluation
from .realtime import evaluation_broadcast_on_commit
from .series import evaluation_series_label


def evaluation_series_name(*, kind: str, label: str, metric: str, own: bool = True) -> str:
    """The run's metric series of one metric of its evaluations of ``label``.

    The run's own environment's are ``eval/<metric>``; another environment's (``own`` false)
    ``eval/<name@version>/<metric>``; a dataset's ``eval/dataset:<name@version>/<metric>``, so that
    several of them, and a dataset named like an environment, chart apart. A label too long for the
    platform's 64 characters is cut, with a hash (``tandem.contracts.metric_series_name``).
    """
    if kind == "dataset" or not own:
        name = f"{EVALUATION_METRIC_PREFIX}{evaluation_series_label(kind=kind, label=label)}/{metric}"
        if len(name) > METRIC_NAME_LENGTH_MAX:
            raise ValueError(f"the series name {name!r} is longer than {METRIC_NAME_LENGTH_MAX} characters")
        return name
    return f"{EVALUATION_METRIC_PREFIX}{metric}"


@transaction.atomic
def evaluation_record(*, run: Run, report: EvaluationReport) -> tuple[Evaluation, bool]:
    """Store the report as the run's evaluation ``report.evaluation`` of its environment or dataset; True
    if it is new.

    A retried post (the trainer posts again when it got no answer) updates the
    same evaluation. Its metrics also become the run's metric points at
    ``report.step`` (:func:`evaluation_series_name`), so that they chart and read like
    the trainer's other series; stored again, a point replaces itself.
    """
    # Locked before the evaluation is written, in the order the telemetry posts lock
    # (the run, then its rows), and so that two posts of one evaluation take turns.
    run = (Run.objects.select_for_update(of=("self",)).select_related("environment_version__environment")
           .get(pk=run.pk))
    evaluation, created = Evaluation.objects.update_or_create(
        run=run,
        index=report.evaluation,
        kind=report.kind,
        environment=report.environment,
        defaults={
            "step": report.step,
            "policy_version": report.policy_version,
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
    own = report.environment == str(run.environment_version)
    metric_points_record(
        run=run,
        step=report.step,
        values={evaluation_series_name(kind=report.kind, label=report.environment, metric=name, own=own): value
                for name, value in report.metrics.items()},
    )
    evaluation_broadcast_on_commit(evaluation)
    return evaluation, created


def evaluation_run_create(*, user: AbstractBaseUser, run: Run, step: int | None = None,
                          evaluation: dict[str, Any] | None = None, name: str = "") -> Run:
    """An evaluation-only run of ``run``'s kept checkpoint ``step`` (None: its newest): no training.

    A clone of ``run`` (its environment version, model and optimizer, so its train
    state restores) that starts from the checkpoint (``start_from``), trains no SFT
    or RL step, and evaluates once, with ``evaluation`` (default ``run``'s own
    section, else the defaults). The caller has checked that the user sees ``run``.
    """
    kept = Checkpoint.objects.filter(run=run, status=Checkpoint.Status.AVAILABLE)
    checkpoint = kept.filter(step=step).first() if step is not None else kept.order_by("-step").first()
    if checkpoint is None:
        steps = sorted(kept.values_list("step", flat=True))
        raise InvalidInput.for_field("step", (
            f"Run {run.pk} has no kept checkpoint" + (f" of step {step}" if step is not None else "")
            + (f"; its kept steps are {', '.join(map(str, steps))}." if steps else ".")))
    section = evaluation if evaluation is not None else (run.config.get("evaluation") or {})
    try:
        section = EvaluationConfig.model_validate(section).model_dump()
    except pydantic.ValidationError as error:
        raise InvalidInput.from_pydantic(error, prefix="evaluation") from None
    start_from = {"run": run.pk, "step": checkpoint.step}
    changes = {"sft_steps": 0, "rl_steps": 0, "evaluation": section, "start_from": start_from}
    return run_clone(user=user, run=run, config_changes=changes, checked_start_from=start_from,
                     name=name or f"evaluation of {run.name} step {checkpoint.step}"[:200])
