"""Reads of evaluations; callers pass a run the user may see (runs.selectors)."""

from __future__ import annotations

import logging

import pydantic
import redis
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from runs.models import Run
from tandem.contracts import EvaluationProgress, SchemaVersionError, evaluation_progress_key

from .models import Evaluation

logger = logging.getLogger(__name__)


def evaluation_list(*, run: Run) -> QuerySet[Evaluation]:
    """The run's evaluations, first one first."""
    # The environment rows of a point before its datasets', as the run page inserts live rows.
    return Evaluation.objects.filter(run=run).order_by("index", "-kind", "environment")


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


def evaluation_progress_list(*, run: Run) -> list[EvaluationProgress] | None:
    """How far each of the run's evaluations has come, as its trainer keeps it in Redis, first one first;
    None if Redis is unreachable.

    An evaluation appears once its trainer asks for it and stays after its report (with the
    report's status) until the run's keys expire. A field that does not read as an
    ``EvaluationProgress`` (a newer trainer's shape) is left out.
    """
    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2)
        try:
            raw_progress = client.hvals(evaluation_progress_key(run.pk))
        finally:
            client.close()
    except redis.RedisError as exc:
        logger.warning("evaluation progress of run %s not read: %s", run.pk, exc)
        return None
    progress = []
    for raw in raw_progress:
        try:
            progress.append(EvaluationProgress.model_validate_json(raw))
        except (pydantic.ValidationError, SchemaVersionError):
            continue
    return sorted(progress, key=lambda item: item.evaluation)
