"""The dashboard's evaluations page: every evaluation of the user's projects, sortable, comparable, as CSV.

A row is a policy (a run's version, or the checkpoint an evaluation-only run
started from) on an environment version. Rows sort by any metric; ticked rows
are compared side by side (a metric a row, a policy a column); the CSV holds
what the table shows, intervals included.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import render

from accounts.selectors import project_list
from common.spreadsheet import spreadsheet_safe
from tandem.contracts import (
    DATASET_EVALUATION_METRICS,
    EVALUATION_LEADING_METRICS,
    EVALUATION_TOOL_METRICS,
)

from .models import Evaluation
from .selectors import evaluation_list_for_user

# Columns a row sorts by besides its metrics.
FIELD_SORTS = ("created", "step", "episodes")


@dataclass(frozen=True)
class Filters:
    project_id: int | None
    environment: str
    sort: str
    descending: bool
    compared: frozenset[int]


def _filters(request) -> Filters:
    project = request.GET.get("project", "")
    sort = request.GET.get("sort", "created")
    return Filters(
        project_id=int(project) if project.isdigit() else None,
        environment=request.GET.get("environment", "").strip(),
        sort=sort,
        descending=request.GET.get("order", "desc") != "asc",
        compared=frozenset(int(value) for value in request.GET.getlist("compare") if value.isdigit()),
    )


def policy_label(evaluation: Evaluation) -> str:
    """What was evaluated: a run's version, or the checkpoint an evaluation-only run started from."""
    start_from = evaluation.run.config.get("start_from")
    if start_from:
        return f"run {start_from['run']} checkpoint {start_from['step']}"
    return f"{evaluation.run.name} v{evaluation.policy_version}"


def metric_columns(evaluations: list[Evaluation]) -> list[str]:
    """Success rate and mean reward, then each pass@k and avg@k that any row has, by k, then the tool-use
    metrics if any row's environment offers tools, then the held-out loss, perplexity and token accuracy
    if any row is of a dataset."""
    names = {name for evaluation in evaluations for name in evaluation.metrics}
    others = {name for name in names if name.startswith(("pass@", "avg@"))}
    return [*EVALUATION_LEADING_METRICS, *sorted(others, key=lambda name: (int(name.split("@")[1]), name)),
            *(name for name in EVALUATION_TOOL_METRICS if name in names),
            *(name for name in DATASET_EVALUATION_METRICS if name in names)]


def _sorted(evaluations: list[Evaluation], filters: Filters) -> list[Evaluation]:
    if filters.sort in FIELD_SORTS:
        def key(evaluation):
            return {"created": evaluation.created_at.timestamp(), "step": evaluation.step,
                    "episodes": evaluation.episodes}[filters.sort]
        return sorted(evaluations, key=key, reverse=filters.descending)
    # Rows without the metric go last whatever the order.
    having = [evaluation for evaluation in evaluations if filters.sort in evaluation.metrics]
    missing = [evaluation for evaluation in evaluations if filters.sort not in evaluation.metrics]
    return sorted(having, key=lambda e: e.metrics[filters.sort], reverse=filters.descending) + missing


def metric_cell(evaluation: Evaluation, name: str) -> dict:
    """A metric's cell of a table (``evaluations/_metric_value.html`` draws it): value and interval, or None."""
    return {"value": evaluation.metrics.get(name), "interval": evaluation.intervals.get(name)}


def _evaluations(request) -> tuple[list[Evaluation], list[str], Filters]:
    filters = _filters(request)
    evaluations = list(evaluation_list_for_user(user=request.user, project_id=filters.project_id,
                                                environment=filters.environment))
    return _sorted(evaluations, filters), metric_columns(evaluations), filters


@login_required
def evaluation_list_page(request):
    evaluations, columns, filters = _evaluations(request)
    rows = [{"evaluation": evaluation, "policy": policy_label(evaluation),
             "cells": [metric_cell(evaluation, name) for name in columns],
             "compared": evaluation.pk in filters.compared} for evaluation in evaluations]
    compared = [row for row in rows if row["compared"]]
    comparison = [{"metric": name, "cells": [row["cells"][index] for row in compared]}
                  for index, name in enumerate(columns)] if len(compared) > 1 else []
    query = request.GET.copy()
    query.pop("sort", None)
    query.pop("order", None)
    return render(request, "evaluations/list.html", {
        "rows": rows, "columns": columns, "filters": filters, "projects": project_list(user=request.user),
        "compared": compared, "comparison": comparison, "sort_query": query.urlencode(),
        "csv_query": request.GET.urlencode(),
    })


@login_required
def evaluation_csv(request):
    """The page's table (its filters and order) as CSV: a column per metric and one per interval bound."""
    evaluations, columns, _ = _evaluations(request)
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["project", "run", "run_name", "policy", "index", "step", "policy_version", "kind", "environment",
                     "status", "episodes", "tasks", "samples_per_task", "temperature",
                     *(f"{name}{suffix}" for name in columns for suffix in ("", "_low", "_high"))])
    for evaluation in evaluations:
        values = []
        for name in columns:
            interval = evaluation.intervals.get(name) or ("", "")
            values += [evaluation.metrics.get(name, ""), *interval]
        writer.writerow([spreadsheet_safe(value) for value in (
            evaluation.run.project.name, evaluation.run_id, evaluation.run.name, policy_label(evaluation),
            evaluation.index, evaluation.step, evaluation.policy_version, evaluation.kind, evaluation.environment,
            evaluation.status, evaluation.episodes, evaluation.tasks, evaluation.samples_per_task,
            evaluation.temperature, *values)])
    response = HttpResponse(out.getvalue(), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="evaluations.csv"'
    return response
