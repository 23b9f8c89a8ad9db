"""Reads of sweeps: the caller's, one with its trials, and what its study says of its parameters."""

from __future__ import annotations

import logging

import optuna
from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Prefetch, QuerySet

from common.domain_errors import NotFound

from .models import Sweep, SweepTrial
from .studies import sweep_study

logger = logging.getLogger(__name__)


def sweep_list(*, user: AbstractBaseUser) -> QuerySet[Sweep]:
    """The sweeps of the user's projects, newest first, each with its trials and their runs (one query for a
    whole page)."""
    trials = SweepTrial.objects.select_related("run").order_by("number")
    return (Sweep.objects.filter(project__memberships__user=user).select_related("project").distinct()
            .prefetch_related(Prefetch("trials", queryset=trials)))


def sweep_get_for_user(*, user: AbstractBaseUser, sweep_id: int) -> Sweep:
    sweep = sweep_list(user=user).filter(pk=sweep_id).first()
    if sweep is None:
        raise NotFound(f"Sweep {sweep_id} not found.")
    return sweep


def sweep_best(*, sweep: Sweep) -> SweepTrial | None:
    """Its complete trial with the best value (the highest, or the lowest when it minimizes; the first by
    number of equals), from its trials as sweep_list prefetches them, or as read here."""
    complete = [trial for trial in sweep.trials.all()  # by number: the prefetch's order and the model's
                if trial.state == SweepTrial.State.COMPLETE and trial.value is not None]
    return (max if sweep.goal == Sweep.Goal.MAXIMIZE else min)(complete, key=lambda trial: trial.value, default=None)


def sweep_importances(*, sweep: Sweep) -> tuple[dict[str, float], str]:
    """Optuna's importance of each parameter for the metric (fANOVA, summing to 1), and why there is none
    when there is none (too few complete trials, a parameter that never varied)."""
    complete = sweep.trials.filter(state=SweepTrial.State.COMPLETE).count()
    if complete < 2:
        return {}, f"{complete} complete trial{'s' if complete != 1 else ''}: importances need at least 2."
    try:
        return dict(optuna.importance.get_param_importances(sweep_study(sweep))), ""
    except (RuntimeError, ValueError) as error:
        return {}, f"Optuna could not weigh the parameters yet: {error}"


#: What a list says instead of each sweep's importances, which cost a fANOVA fit each.
IMPORTANCES_IN_DETAIL = "Read the sweep itself (GET /api/sweeps/<id>/) for its importances."


def sweep_details(*, sweeps: list[Sweep], importances: bool = True) -> dict[int, dict]:
    """Per sweep: its trials, its best trial and (``importances``) its importances, as the API and the page
    show them."""
    details = {}
    for sweep in sweeps:
        trials = list(sweep.trials.all())  # prefetched by sweep_list
        details[sweep.pk] = {"trials": trials, "best": sweep_best(sweep=sweep), "importances": (
            sweep_importances(sweep=sweep) if importances else ({}, IMPORTANCES_IN_DETAIL))}
    return details
