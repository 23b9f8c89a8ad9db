"""Reads of checkpoints; the caller has already checked the run is visible to the user."""

from __future__ import annotations

from django.db.models import QuerySet

from domain_errors import NotFound
from runs.models import Run

from .models import Checkpoint


def checkpoint_list(*, run: Run) -> QuerySet[Checkpoint]:
    """Every checkpoint the run's trainer reported, deleted ones included, newest first."""
    return Checkpoint.objects.filter(run=run).order_by("-step")


def checkpoint_get(*, run: Run, step: int) -> Checkpoint:
    checkpoint = Checkpoint.objects.filter(run=run, step=step).first()
    if checkpoint is None:
        raise NotFound(f"Run {run.pk} has no checkpoint of step {step}.")
    return checkpoint
