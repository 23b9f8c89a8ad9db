"""Reads of runs."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Q, QuerySet, TextField
from django.db.models.functions import Cast

from common.domain_errors import Conflict, InvalidInput, NotFound
from environment_registry.models import EnvironmentVersion
from environment_registry.selectors import environment_version_resolve
from tandem.configs.memory_plan import memory_plan
from tandem.contracts import TERMINAL_RUN_STATUSES, TRAINER_HEADER, TrainerConflictCode
from tandem.runtime.process_reports import live_process_reports_at

from .models import Run, RunAttempt


def run_list(*, user: AbstractBaseUser, status: str | None = None) -> QuerySet[Run]:
    """Runs of the user's projects, newest first."""
    runs = Run.objects.filter(project__memberships__user=user)
    if status is not None:
        if status not in Run.Status.values:
            raise InvalidInput.for_field(
                "status", f"Unknown status '{status}'; one of {', '.join(Run.Status.values)}."
            )
        runs = runs.filter(status=status)
    return runs.select_related("project", "environment", "environment_version").order_by("-created_at", "-id")


def run_get_for_user(*, user: AbstractBaseUser, run_id: int) -> Run:
    """The run, if it belongs to one of the user's projects; others' runs are reported as missing."""
    run = run_list(user=user).filter(pk=run_id).first()
    if run is None:
        raise NotFound(f"Run {run_id} not found.")
    return run


def run_is_visible(*, user: AbstractBaseUser, run_id: int) -> bool:
    return user.is_authenticated and run_list(user=user).filter(pk=run_id).exists()


def run_is_visible_to_user_id(*, user_id: int, run_id: int) -> bool:
    """:func:`run_is_visible` for the user as it is now: deactivated, it sees nothing."""
    user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
    return user is not None and run_is_visible(user=user, run_id=run_id)


def run_get(*, run_id: int) -> Run:
    """Any run, for the trainer, which works on every project's runs."""
    run = Run.objects.select_related("project", "environment", "environment_version").filter(pk=run_id).first()
    if run is None:
        raise NotFound(f"Run {run_id} not found.")
    return run


def run_attempt_list(*, run: Run) -> list[RunAttempt]:
    """The run's attempts, first claim first (the run was read through the user's scope already)."""
    return list(RunAttempt.objects.filter(run=run).order_by("number"))


def run_get_held_by(*, run_id: int, trainer: str) -> Run:
    """The run, for a write by ``trainer``, which must be the trainer holding it.

    A trainer the reaper presumed dead may still be alive: its telemetry,
    samples, checkpoints and traces must not overwrite what the run's new
    holder writes, nor land on a run no trainer holds.
    """
    if not trainer:
        raise InvalidInput.for_field(TRAINER_HEADER, "Name the trainer that holds the run (its hostname:pid).")
    run = run_get(run_id=run_id)
    if not run.claimed_by:
        raise Conflict(f"Run {run.pk} is held by no trainer; claim it before writing to it.",
                       code=TrainerConflictCode.RUN_NOT_CLAIMED)
    if run.claimed_by != trainer:
        raise Conflict(f"Run {run.pk} is held by trainer {run.claimed_by}, not {trainer}.",
                       code=TrainerConflictCode.RUN_HELD_BY_ANOTHER_TRAINER)
    return run


# Sortable columns of the run list: what a page asks for -> the fields ordered by.
RUN_SORTS: dict[str, tuple[str, ...]] = {
    "name": ("name", "id"),
    "environment": ("environment__name", "id"),
    "status": ("status", "id"),
    "step": ("trainer_step", "id"),
    "policy": ("policy_version", "id"),
    "created": ("created_at", "id"),
}


def run_search(
    *,
    user: AbstractBaseUser,
    status: str | None = None,
    environment: str | None = None,
    name_contains: str | None = None,
    sort: str = "-created",
) -> QuerySet[Run]:
    """The user's runs filtered by status, environment name and a piece of the run's name or of one of its tags.

    ``sort`` is a key of RUN_SORTS, descending with a leading ``-``.
    """
    runs = run_list(user=user, status=status)
    if environment:
        runs = runs.filter(environment__name=environment)
    if name_contains:
        runs = runs_named_or_tagged(runs, name_contains)
    descending = sort.startswith("-")
    fields = RUN_SORTS.get(sort.removeprefix("-"))
    if fields is None:
        raise InvalidInput.for_field("sort", f"Unknown sort '{sort}'; one of {', '.join(RUN_SORTS)}.")
    return runs.order_by(*(f"-{field}" if descending else field for field in fields))


def runs_named_or_tagged(runs: QuerySet[Run], text: str) -> QuerySet[Run]:
    """``runs`` whose name or one of whose tags holds ``text`` (case-insensitive)."""
    # A tag counts as part of what a run is called: its tags' JSON text ('["baseline", "lr"]'),
    # which PostgreSQL and SQLite both search, where JSON containment is PostgreSQL's only.
    return runs.annotate(tags_text=Cast("tags", TextField())).filter(
        Q(name__icontains=text) | Q(tags_text__icontains=text))


def run_memory_plan(run: Run, *, trainer_device: TrainerDeviceMemory | None) -> dict[str, dict[str, int]]:
    """The run's expected peak memory of its trainer and of one producer engine, by part
    (tandem/configs/memory_plan.py), for this deployment's worker concurrency and the platform of
    ``trainer_device`` (:func:`trainer_device_memory`, read once per request; None: not known), as a new
    run is checked."""
    return memory_plan(run.config, worker_concurrency=settings.TANDEM_RUN_QUOTAS.worker_concurrency,
                       trainer_platform=trainer_device.platform if trainer_device else None).as_dict()


@dataclass(frozen=True)
class TrainerDeviceMemory:
    """The most device memory a live trainer of this deployment reports, and which trainer."""

    bytes: int
    trainer: str  # hostname:pid
    platform: str | None  # its devices' JAX platform (tpu, gpu); None in reports from before it was sent


def trainer_device_memory() -> TrainerDeviceMemory | None:
    """The largest device memory that a live trainer reports (each its smallest accelerator's): the most a
    run can be given. None when no live trainer reports one (CPU trainers, none started yet) or Redis
    cannot be read: the run's plan is then checked against TANDEM_TRAINER_MEMORY_BYTES alone."""
    reports = live_process_reports_at(settings.REDIS_URL) or []
    reported = [report for report in reports if report.role == "trainer" and report.device_memory_bytes]
    if not reported:
        return None
    largest = max(reported, key=lambda report: report.device_memory_bytes)
    return TrainerDeviceMemory(bytes=largest.device_memory_bytes, trainer=f"{largest.hostname}:{largest.pid}",
                               platform=largest.device_platform)


def run_evaluation_environments(run: Run) -> list[EnvironmentVersion]:
    """The environment versions a run's evaluations run on besides its own, as its config pins them."""
    references = (run.config.get("evaluation") or {}).get("environments") or []
    return [environment_version_resolve(project=run.project, reference=reference) for reference in references]


def runs_using_dataset_version(*, version) -> list[str]:
    """The runs of the version's project that have not ended and pin dataset ``version`` (a
    DatasetVersion) in ``sft.datasets`` or ``evaluation.datasets``, each as ``run <id> (<status>)``:
    what keeps it from being deleted (dataset_registry.services.VERSION_USERS)."""
    name, number = version.dataset.name, version.number
    using = []
    for run in Run.objects.filter(project_id=version.dataset.project_id).exclude(status__in=TERMINAL_RUN_STATUSES):
        config = run.config or {}
        pinned = [*(config.get("sft") or {}).get("datasets", ()), *(config.get("evaluation") or {}).get("datasets", ())]
        if any(entry.get("name") == name and entry.get("version") == number for entry in pinned):
            using.append(f"run {run.pk} ({run.status}, not ended)")
    return using
