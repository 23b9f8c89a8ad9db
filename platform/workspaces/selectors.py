"""Reads of the workspace: the runs a view selects with its table's columns, their series on one grid,
saved views and reports."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import FloatField, OuterRef, QuerySet, Subquery
from django.utils import timezone

from accounts.models import Project
from common.domain_errors import InvalidInput, NotFound
from runs.models import Run
from runs.selectors import runs_named_or_tagged
from telemetry.models import MetricBucket, MetricPoint
from telemetry.selectors import RunsChart, metric_chart_runs

from .models import Report, SavedView
from .view_state import WorkspaceView, filter_matches

#: Runs one workspace reads at most, the newest first: past it the page says how many it left out.
MAX_WORKSPACE_RUNS = 500
#: Config keys the column picker offers at most (the flattened keys of the runs read).
MAX_CONFIG_KEYS = 400
#: Runs one series request may name: what the workspace reads, at most.
MAX_SERIES_RUNS = MAX_WORKSPACE_RUNS
NO_GROUP = "(none)"


@dataclass(frozen=True)
class WorkspaceRuns:
    rows: list[dict]  # the runs shown, sorted: id, name, status, tags, group, values {column: value}
    matched: int  # runs the search and status select in the project
    read: int  # of those, the newest MAX_WORKSPACE_RUNS, whose columns were read
    filtered_out: int  # of those read, the runs a column filter left out
    config_keys: list[str]  # config.<path> columns offered
    metric_names: list[str]  # metric names of the runs read (panels and metric.<name> columns)


def _config_value(config: dict, path: str):
    value = config
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def _leaf_paths(config: dict, prefix: str = "") -> list[str]:
    paths = []
    for key, value in config.items():
        path = f"{prefix}{key}"
        paths += _leaf_paths(value, f"{path}.") if isinstance(value, dict) and value else [path]
    return paths


def _group_label(run: Run, group_by: str) -> str:
    if group_by == "tag":
        return ", ".join(sorted(run.tags)) if run.tags else NO_GROUP
    value = _config_value(run.config, group_by.removeprefix("config."))
    return NO_GROUP if value is None else str(value)


def _sort_key(value):
    """Numbers before text, each in order; a missing value last whichever the direction."""
    if value is None:
        return (2, 0, "")
    if isinstance(value, bool | int | float):
        return (0, float(value), "")
    return (1, 0, ", ".join(map(str, value)) if isinstance(value, list) else str(value).lower())


def _duration_s(run: Run, now: datetime.datetime) -> float | None:
    if run.started_at is None:
        return None
    return round(((run.finished_at or now) - run.started_at).total_seconds(), 1)


def workspace_runs(*, project: Project, view: WorkspaceView, now: datetime.datetime | None = None) -> WorkspaceRuns:
    """The project's runs that ``view``'s search, status and column filters select, sorted by its sort,
    each with the values of its columns (a ``metric.<name>`` column: the newest value of that series)."""
    now = now or timezone.now()
    runs = Run.objects.filter(project=project)
    if view.status:
        runs = runs.filter(status=view.status)
    if view.search:
        runs = runs_named_or_tagged(runs, view.search)
    matched = runs.count()
    metrics = view.summary_metrics()
    annotations = {
        f"summary_{index}": Subquery(
            MetricPoint.objects.filter(run=OuterRef("pk"), name=name).order_by("-step").values("value")[:1],
            output_field=FloatField())
        for index, name in enumerate(metrics)
    }
    read = list(runs.annotate(**annotations).order_by("-created_at", "-id")[:MAX_WORKSPACE_RUNS])

    config_keys: dict[str, None] = {}
    rows = []
    for run in read:
        for path in _leaf_paths(run.config):
            if len(config_keys) >= MAX_CONFIG_KEYS:
                break
            config_keys.setdefault(f"config.{path}")
        values = {
            "name": run.name, "status": run.status, "tags": list(run.tags), "step": run.trainer_step,
            "duration": _duration_s(run, now), "created": run.created_at.isoformat(),
            "group": _group_label(run, view.group_by) if view.group_by else None,
        }
        values |= {f"config.{path}": _config_value(run.config, path) for path in view.config_paths()}
        values |= {f"metric.{name}": getattr(run, f"summary_{index}") for index, name in enumerate(metrics)}
        if all(filter_matches(expression, values.get(column)) for column, expression in view.filters.items()):
            rows.append({"id": run.pk, "name": run.name, "status": run.status, "status_reason": run.status_reason,
                         "tags": list(run.tags), "group": values["group"],
                         "sft_steps": int(run.config.get("sft_steps") or 0), "values": values})
    if view.sort:
        column = view.sort.removeprefix("-")
        present = [row for row in rows if row["values"].get(column) is not None]
        missing = [row for row in rows if row["values"].get(column) is None]
        present.sort(key=lambda row: _sort_key(row["values"][column]), reverse=view.sort.startswith("-"))
        rows = present + missing
    names = sorted(set(
        MetricBucket.objects.filter(run_id__in=[run.pk for run in read],
                                    resolution=MetricBucket.BUCKET_RESOLUTIONS[-1])
        .values_list("name", flat=True).distinct()))
    return WorkspaceRuns(rows=rows, matched=matched, read=len(read), filtered_out=len(read) - len(rows),
                         config_keys=sorted(config_keys), metric_names=names)


def workspace_series(*, project: Project, run_ids: Sequence[int], names: Sequence[str], points: int,
                     from_step: int | None = None, to_step: int | None = None) -> RunsChart:
    """The series ``names`` of the project's runs ``run_ids``, bucketed on one grid (telemetry's
    metric_chart_runs); a run of another project, or none, is an InvalidInput naming it."""
    if len(run_ids) > MAX_SERIES_RUNS:
        raise InvalidInput.for_field("runs", f"at most {MAX_SERIES_RUNS} runs, not {len(run_ids)}.")
    found = set(Run.objects.filter(project=project, pk__in=run_ids).values_list("pk", flat=True))
    missing = [run_id for run_id in run_ids if run_id not in found]
    if missing:
        raise InvalidInput.for_field("runs", f"no run {missing[0]} in project {project.pk}.")
    return metric_chart_runs(run_ids=run_ids, names=names, points=points, from_step=from_step, to_step=to_step)


def saved_view_list(*, project: Project) -> QuerySet[SavedView]:
    return SavedView.objects.filter(project=project).select_related("created_by").order_by("name", "id")


def saved_view_get(*, project: Project, view_id: int) -> SavedView:
    view = saved_view_list(project=project).filter(pk=view_id).first()
    if view is None:
        raise NotFound(f"Saved view {view_id} not found in project {project.pk}.")
    return view


def saved_views_by_name(*, project: Project, names: Sequence[str]) -> dict[str, SavedView]:
    return {view.name: view for view in SavedView.objects.filter(project=project, name__in=list(names))}


def report_list(*, user: AbstractBaseUser, project: Project | None = None) -> QuerySet[Report]:
    """The reports of the user's projects (of ``project`` only, when given), newest change first."""
    reports = Report.objects.filter(project__memberships__user=user)
    if project is not None:
        reports = reports.filter(project=project)
    return reports.select_related("project", "created_by", "updated_by").order_by("-updated_at", "-id")


def report_get_for_user(*, user: AbstractBaseUser, project_id: int, report_id: int) -> Report:
    """The project's report, if the user belongs to the project; others' reports are reported as missing."""
    report = report_list(user=user).filter(pk=report_id, project_id=project_id).first()
    if report is None:
        raise NotFound(f"Report {report_id} not found in project {project_id}.")
    return report


def project_is_visible_to_user_id(*, user_id: int, project_id: int) -> bool:
    """Whether the user (active) belongs to the project: who may follow its runs live."""
    return Project.objects.filter(pk=project_id, memberships__user_id=user_id,
                                  memberships__user__is_active=True).exists()
