"""Reads of run logs: a run's lines by cursor, level, process and text, and which streams to drain."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db.models import Count, Q, QuerySet
from django.utils import timezone

from common.domain_errors import InvalidInput
from runs.models import Run
from tandem.contracts import RUN_LOG_LEVELS, TRAINER_HELD_RUN_STATUSES, RunStatus

from .models import RunLogLine, RunLogState


@dataclass(frozen=True)
class RunLogFilters:
    """What a reader asks for: lines at ``level`` or above, of ``process``, containing ``text``, from no
    logger of ``hidden_loggers``."""

    level: str | None = None  # a name of RUN_LOG_LEVELS
    process: str = ""  # a role (trainer, rollout_worker) or one process, "hostname:pid"
    text: str = ""
    # Loggers whose lines, and their children's ("absl" hides "absl.foo" too), are left out.
    hidden_loggers: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunLogPage:
    lines: list[RunLogLine]
    has_more: bool  # more lines match past this page, in its direction
    lines_kept: int
    lines_deleted: int
    lines_lost: int


def run_log_lines(*, run: Run, filters: RunLogFilters) -> QuerySet[RunLogLine]:
    """The run's lines that match ``filters``, oldest first."""
    lines = RunLogLine.objects.filter(run=run)
    if filters.level:
        level = RUN_LOG_LEVELS.get(filters.level.upper())
        if level is None:
            raise InvalidInput.for_field("level", f"Unknown level '{filters.level}'; one of "
                                                  f"{', '.join(RUN_LOG_LEVELS)}.")
        lines = lines.filter(level__gte=level)
    if filters.process:
        hostname, _, pid = filters.process.rpartition(":")
        if hostname and pid.isdigit():
            lines = lines.filter(hostname=hostname, pid=int(pid))
        else:
            lines = lines.filter(role=filters.process)
    if filters.text:
        lines = lines.filter(Q(message__icontains=filters.text) | Q(traceback__icontains=filters.text)
                             | Q(logger__icontains=filters.text))
    for logger in filters.hidden_loggers:
        lines = lines.exclude(Q(logger=logger) | Q(logger__startswith=f"{logger}."))
    return lines.order_by("id")


def run_log_loggers(*, run: Run) -> list[dict]:
    """Each logger of the run's kept lines with how many it wrote, the busiest first: what a reader may hide."""
    counts = (RunLogLine.objects.filter(run=run).values("logger").annotate(lines=Count("id"))
              .order_by("-lines", "logger"))
    return [{"logger": row["logger"], "lines": row["lines"]} for row in counts]


def run_log_page(*, run: Run, filters: RunLogFilters, after: int | None, before: int | None,
                 limit: int) -> RunLogPage:
    """A page of the matching lines, oldest first: after the ``after`` cursor; else the newest
    ``limit`` before ``before`` (or the newest of all: the tail)."""
    lines = run_log_lines(run=run, filters=filters)
    if after is not None:
        page = list(lines.filter(id__gt=after)[: limit + 1])
        has_more = len(page) > limit
        page = page[:limit]
    else:
        if before is not None:
            lines = lines.filter(id__lt=before)
        page = list(lines.order_by("-id")[: limit + 1])
        has_more = len(page) > limit
        page = page[:limit][::-1]
    state = RunLogState.objects.filter(run=run).first()
    return RunLogPage(lines=page, has_more=has_more, lines_kept=state.lines_kept if state else 0,
                      lines_deleted=state.lines_deleted if state else 0, lines_lost=state.lines_lost if state else 0)


def run_log_state(*, run: Run) -> RunLogState:
    """The run's counters (an unsaved, empty one before its first line)."""
    return RunLogState.objects.filter(run=run).first() or RunLogState(run=run)


def run_log_streams_to_drain() -> list[int]:
    """Runs whose trainer or producers may still log: held, paused or queued again, or ended lately
    (producers finish their tasks after a run ends)."""
    ended_since = timezone.now() - timedelta(seconds=settings.TANDEM_RUN_LOG_DRAIN_AFTER_END_S)
    return list(
        Run.objects.filter(
            Q(status__in=[*TRAINER_HELD_RUN_STATUSES, RunStatus.PAUSED])
            | Q(status=RunStatus.QUEUED, attempts__gt=0)
            | Q(finished_at__gte=ended_since)
        ).order_by("id").values_list("id", flat=True)
    )
