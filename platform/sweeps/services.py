"""Writes of sweeps: create one, advance it (follow its trials' runs, prune, start the next), cancel it.

Optuna does the sampling (grid, random, TPE), the pruning (median, successive halving) and the
importances; this module only turns its trials into runs and its runs' metrics into its reports. A
trial's value is its run's ``metric`` at the run's last step; each step's value is reported to the study
as it comes, and a trial its pruner stops is a run cancelled with the pruner's reason.
"""

from __future__ import annotations

import logging
import uuid

import optuna
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from accounts.models import Project
from accounts.permissions import project_require_writer
from common.domain_errors import DomainError, InvalidInput
from runs.models import Run
from runs.services import run_annotate, run_config_check, run_create, run_transition
from tandem.contracts import TERMINAL_RUN_STATUSES, RunStatus
from telemetry.selectors import metric_points_after

from .models import Sweep, SweepTrial
from .search_space import grid, search_space_distributions, trial_config
from .selectors import sweep_best
from .studies import sweep_study

logger = logging.getLogger(__name__)

#: Runs one sweep may make at most.
MAX_SWEEP_RUNS = 500
#: Points of a trial's metric reported to the study per advance at most (the rest at the next one).
REPORTED_POINTS_PER_ADVANCE = 1000


# ---- create, cancel ------------------------------------------------------------------------------

@transaction.atomic
def sweep_create(*, user: AbstractBaseUser, project: Project, environment: str, name: str, base_config: dict,
                 search_space: dict, sampler: str, metric: str, goal: str, max_runs: int, concurrency: int,
                 pruner: str = Sweep.Pruner.NONE, seed: int = 0) -> Sweep:
    """A sweep of ``project``; its first trials start once it commits (sweep_advance).

    Every trial's run is checked as Start checks a run: the base config with each dimension at its low
    end (its first choice) must be a valid run of ``environment``, or nothing is created.
    """
    project_require_writer(user=user, project=project)
    for field, value, choices in (("sampler", sampler, Sweep.Sampler.values), ("pruner", pruner, Sweep.Pruner.values),
                                  ("goal", goal, Sweep.Goal.values)):
        if value not in choices:
            raise InvalidInput.for_field(field, f"Expected one of {', '.join(choices)}.")
    if not metric.strip():
        raise InvalidInput.for_field("metric", "The series each trial is judged by, e.g. reward_mean.")
    if not 1 <= max_runs <= MAX_SWEEP_RUNS:
        raise InvalidInput.for_field("max_runs", f"From 1 to {MAX_SWEEP_RUNS}.")
    cap = settings.TANDEM_RUN_QUOTAS.max_active_runs_per_project
    if not 1 <= concurrency <= cap:
        raise InvalidInput.for_field("concurrency", f"From 1 to this deployment's {cap} active runs a project may "
                                                    "have (TANDEM_MAX_ACTIVE_RUNS_PER_PROJECT).")
    if not isinstance(base_config, dict):
        raise InvalidInput.for_field("base_config", "A run config (or part of one) as an object.")
    distributions = search_space_distributions(search_space, sampler=sampler)
    if sampler == Sweep.Sampler.GRID:
        points = 1
        for values in grid(distributions).values():
            points *= len(values)
        max_runs = min(max_runs, points)
    lowest = {path: (distribution.choices[0] if isinstance(distribution, CategoricalDistribution)
                     else distribution.low) for path, distribution in distributions.items()}
    run_config_check(user=user, project=project, environment_name=environment,
                     config=trial_config(base_config, lowest))
    sweep = Sweep.objects.create(
        project=project, name=name.strip() or f"sweep of {environment}", environment=environment,
        base_config=base_config, search_space=search_space, sampler=sampler, pruner=pruner, metric=metric.strip(),
        goal=goal, max_runs=max_runs, concurrency=concurrency, seed=seed, created_by=user,
        study_name=f"tandem-sweep-{uuid.uuid4().hex}",
    )
    transaction.on_commit(lambda: sweep_advance(sweep_id=sweep.pk), robust=True)
    return sweep


def sweep_cancel(*, user: AbstractBaseUser, sweep: Sweep) -> Sweep:
    """Stop the sweep: its running trials' runs are cancelled, and it starts no more."""
    project_require_writer(user=user, project=sweep.project)
    with transaction.atomic():
        sweep = Sweep.objects.select_for_update().get(pk=sweep.pk)
        if sweep.status != Sweep.Status.RUNNING:
            return sweep
        study = sweep_study(sweep)
        for trial in sweep.trials.filter(state=SweepTrial.State.RUNNING).select_related("run"):
            reason = f"Sweep '{sweep.name}' cancelled by {user}."
            if trial.run is not None and trial.run.status not in TERMINAL_RUN_STATUSES:
                run_transition(run=trial.run, to_status=RunStatus.CANCELLED, reason=reason)
            _trial_end(study, trial, state=SweepTrial.State.FAILED, reason=reason)
        _sweep_end(sweep, status=Sweep.Status.CANCELLED, reason=f"Cancelled by {user}.")
    return sweep


# ---- advance -------------------------------------------------------------------------------------

def sweeps_advance() -> list[int]:
    """Advance every running sweep (Celery beat's task); returns their ids."""
    advanced = []
    for sweep_id in Sweep.objects.filter(status=Sweep.Status.RUNNING).values_list("pk", flat=True):
        try:
            sweep_advance(sweep_id=sweep_id)
        except Exception as error:
            # One broken sweep never stops the others; its next advance tries again, and its page says why
            # it stands still meanwhile.
            logger.exception("sweep %s could not advance", sweep_id)
            Sweep.objects.filter(pk=sweep_id, status=Sweep.Status.RUNNING).update(
                status_reason=f"Its last advance failed, tried again in a moment: {type(error).__name__}: {error}"[:2000])
        advanced.append(sweep_id)
    return advanced


def sweep_advance(*, sweep_id: int) -> Sweep:
    """Follow the sweep's running trials (report their new steps, prune, record the ended), start trials
    up to its concurrency and the project's quota, and end the sweep once every trial has ended."""
    with transaction.atomic():
        sweep = Sweep.objects.select_for_update(of=("self",)).select_related("project", "created_by").get(pk=sweep_id)
        if sweep.status != Sweep.Status.RUNNING:
            return sweep
        study = sweep_study(sweep)
        for trial in sweep.trials.filter(state=SweepTrial.State.RUNNING).select_related("run"):
            _trial_follow(sweep, study, trial)
        if sweep.status_reason:  # a failed advance's, now past
            sweep.status_reason = ""
            sweep.save(update_fields=["status_reason"])
        started = sweep.trials.count()
        running = sweep.trials.filter(state=SweepTrial.State.RUNNING).count()
        while started < sweep.max_runs and running < sweep.concurrency and _project_has_room(sweep):
            if _trial_start(sweep, study):
                running += 1
            started += 1
        if started >= sweep.max_runs and running == 0:
            best = sweep_best(sweep=sweep)
            _sweep_end(sweep, status=Sweep.Status.FINISHED, reason=(
                f"{started} trials; best: run #{best.run_id}, {sweep.metric} {best.value:.6g}" if best is not None
                else f"{started} trials; none completed with {sweep.metric}"))
    return sweep


def _project_has_room(sweep: Sweep) -> bool:
    cap = settings.TANDEM_RUN_QUOTAS.max_active_runs_per_project
    return Run.objects.filter(project=sweep.project).exclude(status__in=TERMINAL_RUN_STATUSES).count() < cap


def _trial_start(sweep: Sweep, study: optuna.Study) -> bool:
    """Ask the study for a trial and start its run; False if the run was refused (the trial failed)."""
    trial = study.ask(search_space_distributions(sweep.search_space, sampler=sweep.sampler))
    record = SweepTrial(sweep=sweep, number=trial.number, optuna_trial_id=trial._trial_id, params=trial.params)
    try:
        if sweep.created_by is None:
            raise InvalidInput.for_field("created_by", "The user who created the sweep is gone.")
        run = run_create(user=sweep.created_by, project=sweep.project, environment_name=sweep.environment,
                         config=trial_config(sweep.base_config, trial.params), name=f"{sweep.name} #{trial.number}")
        run_annotate(user=sweep.created_by, run=run, tags=[f"sweep:{sweep.pk}"])
    except DomainError as error:
        record.save()
        _trial_end(study, record, state=SweepTrial.State.FAILED, reason=f"Its run was refused: {error.message}")
        return False
    record.run = run
    record.save()
    return True


def _trial_follow(sweep: Sweep, study: optuna.Study, trial: SweepTrial) -> None:
    run = trial.run
    if run is None:
        _trial_end(study, trial, state=SweepTrial.State.FAILED, reason="Its run was deleted.")
        return
    after = trial.reported_step if trial.reported_step is not None else -1
    points = metric_points_after(run=run, after_step=after, names=[sweep.metric],
                                 limit=REPORTED_POINTS_PER_ADVANCE).points
    optuna_trial = optuna.trial.Trial(study, trial.optuna_trial_id)
    for step, _, value in points:
        optuna_trial.report(value, step)
        trial.reported_step, trial.value = step, value
    trial.save(update_fields=["reported_step", "value"])
    if run.status in TERMINAL_RUN_STATUSES:
        if run.status == RunStatus.FINISHED and trial.value is not None:
            _trial_end(study, trial, state=SweepTrial.State.COMPLETE, value=trial.value)
        else:
            reason = (f"Its run {run.status}: {run.status_reason}" if run.status != RunStatus.FINISHED
                      else f"Its run finished without a {sweep.metric} point.")
            _trial_end(study, trial, state=SweepTrial.State.FAILED, reason=reason)
        return
    if points and optuna_trial.should_prune():
        reason = (f"Pruned by sweep '{sweep.name}' ({sweep.get_pruner_display()} pruner) at step "
                  f"{trial.reported_step}: {sweep.metric} {trial.value:.6g}.")
        run_transition(run=run, to_status=RunStatus.CANCELLED, reason=reason)
        _trial_end(study, trial, state=SweepTrial.State.PRUNED, reason=reason)


_OPTUNA_STATES = {SweepTrial.State.COMPLETE: TrialState.COMPLETE, SweepTrial.State.PRUNED: TrialState.PRUNED,
                  SweepTrial.State.FAILED: TrialState.FAIL}


def _trial_end(study: optuna.Study, trial: SweepTrial, *, state: str, value: float | None = None,
               reason: str = "") -> None:
    study.tell(trial.number, value if state == SweepTrial.State.COMPLETE else None, state=_OPTUNA_STATES[state],
               skip_if_finished=True)
    trial.state, trial.reason = state, reason
    trial.save(update_fields=["state", "reason"])


def _sweep_end(sweep: Sweep, *, status: str, reason: str) -> None:
    sweep.status, sweep.status_reason, sweep.finished_at = status, reason, timezone.now()
    sweep.save(update_fields=["status", "status_reason", "finished_at"])
