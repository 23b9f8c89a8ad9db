"""Reads of evaluations; callers pass a run the user may see (runs.selectors)."""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from runs.models import Run

from .models import Evaluation


def evaluation_list(*, run: Run) -> QuerySet[Evaluation]:
    """The run's evaluations, first one first."""
    return Evaluation.objects.filter(run=run).order_by("index")


def evaluation_list_for_user(*, user: AbstractBaseUser, project_id: int | None = None,
                             environment: str = "") -> QuerySet[Evaluation]:
    """Evaluations of every run of the user's projects (or of ``project_id``, or of one
    ``environment`` label), without their trajectory ids, newest first."""
    evaluations = Evaluation.objects.filter(run__project__memberships__user=user)
    if project_id is not None:
        evaluations = evaluations.filter(run__project_id=project_id)
    if environment:
        evaluations = evaluations.filter(environment=environment)
    return (evaluations.select_related("run", "run__project").defer("trajectory_ids")
            .order_by("-created_at", "-pk"))
