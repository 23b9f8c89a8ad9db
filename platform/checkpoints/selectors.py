"""Reads of checkpoints; the caller has already checked the run is visible to the user."""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings
from django.db.models import QuerySet

from common.domain_errors import NotFound
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


def checkpoint_path_in_root(*, run_id: int, path: str) -> bool:
    """Whether ``path`` is a step directory of run ``run_id`` under the checkpoint root.

    The trainer writes ``<TANDEM_CHECKPOINT_ROOT>/run-<id>/<step>``; anything else (another
    run's directory, a link out of the root, ``/etc``) is refused when reported, and the web
    process never deletes it.
    """
    resolved = Path(os.path.realpath(path))
    root = Path(os.path.realpath(settings.TANDEM_CHECKPOINT_ROOT))
    return resolved.parent == root / f"run-{run_id}"
