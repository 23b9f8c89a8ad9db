"""Reads of evaluations; callers pass a run the user may see (runs.selectors)."""

from __future__ import annotations

from django.db.models import QuerySet

from runs.models import Run

from .models import Evaluation


def evaluation_list(*, run: Run) -> QuerySet[Evaluation]:
    """The run's evaluations, first one first."""
    return Evaluation.objects.filter(run=run).order_by("index")
