"""The dashboard's run pages: server-rendered templates; charts fill in from the run_page/ scripts."""

import json
import re

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, JsonResponse
from django.shortcuts import redirect, render
from django.template.defaultfilters import date as date_format
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from accounts.models import Membership
from accounts.selectors import project_get_for_user, project_list, project_role
from alerts.selectors import run_alerts_active
from common.confirmation import action_confirmed, confirmation_page
from common.domain_errors import DomainError, Forbidden, NotFound
from common.form_errors import error_placements
from dataset_registry.models import Dataset
from environment_registry.models import EnvironmentVersion
from environment_registry.selectors import environment_list, environment_version_last_probe_times
from evaluations.pages import metric_cell
from evaluations.selectors import evaluation_list
from tandem.configs.run import RunConfig
from tandem.contracts import (
    DATASET_EVALUATION_METRICS,
    EVALUATION_LEADING_METRICS,
    EVALUATION_METRIC_PREFIX,
    EVALUATION_SUCCESS_RATE,
    EVALUATION_TOOL_METRICS,
    LOSS_METRIC,
    RELEASED_RUN_STATUSES,
    SUCCESS_RATE_METRIC,
    TRAINER_HELD_RUN_STATUSES,
    RunStatus,
    evaluation_metric_label,
)
from telemetry.charts import COMPARE_CHARTS, run_charts
from telemetry.selectors import idle_summary, metric_summaries, metric_totals
from telemetry.serializers import MAX_COMPARED_RUNS
from telemetry.services import MAX_TRACE_STEPS

from .config_diff import config_differences, config_tree
from .config_form import config_form, config_from_form, form_state
from .config_form_binding import ErrorEntry, bind_form, error_summary
from .config_form_presets import config_review, form_presets, model_directories
from .forms import RunCloneForm, RunCreateForm
from .models import Run
from .realtime import run_websocket_path
from .selectors import (
    run_attempt_list,
    run_get_for_user,
    run_list,
    run_memory_plan,
    run_search,
    trainer_device_memory,
)
from .services import (
    LEGAL_TRANSITIONS,
    run_cancel,
    run_clone,
    run_config_check,
    run_config_normalise,
    run_create,
    run_pause,
    run_resume,
)
from .summaries import REWARD_METRIC, SUMMARY_SORTS, run_list_sort, run_list_summarised, run_summary

RUNS_SHOWN = 100


@login_required
@require_http_methods(["GET", "POST"])
def run_list_page(request):
    form = RunCreateForm(
        request.POST or None,
        projects=project_list(user=request.user),
        environments=environment_list(user=request.user),
    )
    if request.method == "POST" and form.is_valid():
        try:
            project = project_get_for_user(
                user=request.user, project_id=form.cleaned_data["project"]
            )
            run = run_create(
                user=request.user,
                project=project,
                environment_name=form.cleaned_data["environment"],
                config=form.config(),
                name=form.cleaned_data["name"],
            )
        except Forbidden as error:
            raise PermissionDenied(error.message) from None  # a viewer: 403, as over the API
        except DomainError as error:
            form.add_domain_error(error)
        else:
            return redirect("run-page", run_id=run.pk)
    filters, sort, runs = _run_list_query(request)
    query = request.GET.copy()
    query.pop("sort", None)
    def column(key: str, label: str) -> dict:
        return {"key": key, "label": label, "sort": key if sort != key else f"-{key}",
                "arrow": "▲" if sort == key else "▼" if sort == f"-{key}" else ""}

    columns = [column(key, label) for key, label in (
        ("name", "Run"), ("environment", "Environment"), ("status", "Status"), ("step", "Progress"),
        ("policy", "Policy"), ("created", "Created"))]
    summary_columns = {"reward": column("reward", "Reward"), "duration": column("duration", "Duration")}
    writable_project_ids = _writable_project_ids(request)
    context = {
        "rows": _run_list_rows(runs, writable_project_ids),
        "writable_project_ids": writable_project_ids,
        "reward_metric": REWARD_METRIC,
        "form": form,
        "filters": filters,
        "statuses": Run.Status.values,
        "environments": sorted({environment.name for environment in environment_list(user=request.user)}),
        "columns": columns,
        "summary_columns": summary_columns,
        "sort": sort if request.GET.get("sort") else "",  # kept by the filter form
        "query": query.urlencode(),
        "runs_api_url": reverse("api-runs"),
        "compare_url": reverse("run-compare-page"),
    }
    return render(request, "runs/list.html", context)


def _run_list_query(request, *, tell: bool = True) -> tuple[dict[str, str], str, QuerySet[Run]]:
    """The run list's filters, sort and runs, as the page's query asks; an unknown sort or status is said
    (a message, when ``tell``: the page's, not each live refresh's) and the list shown unfiltered."""
    filters = {key: request.GET.get(key, "").strip() for key in ("status", "environment", "q")}
    sort = request.GET.get("sort") or "-created"
    by_summary = sort.removeprefix("-") in SUMMARY_SORTS
    try:
        runs = run_search(user=request.user, status=filters["status"] or None,
                          environment=filters["environment"] or None, name_contains=filters["q"] or None,
                          sort="-created" if by_summary else sort)
        if by_summary:
            runs = run_list_sort(runs, sort)
    except DomainError as error:
        if tell:
            messages.error(request, error.message)
        filters, sort = {"status": "", "environment": "", "q": ""}, "-created"
        runs = run_search(user=request.user)
    return filters, sort, runs


def _writable_project_ids(request) -> list[int]:
    return [project.pk for project in project_list(user=request.user) if project.role in Membership.WRITER_ROLES]


def _run_list_rows(runs: QuerySet[Run], writable_project_ids: list[int]) -> list[dict]:
    now = timezone.now()
    return [{"run": run, "summary": run_summary(run, now=now), "can_write": run.project_id in writable_project_ids}
            for run in run_list_summarised(runs.select_related("project", "environment"))[:RUNS_SHOWN]]


@login_required
@require_GET
def run_list_rows_page(request):
    """The run list's rows as the page draws them (runs/_row.html), for its live refresh (run_list.js):
    ``{"rows": [{"id", "status", "html"}]}``, in the list's order, for the same query as the page."""
    _, _, runs = _run_list_query(request, tell=False)
    rows = _run_list_rows(runs, _writable_project_ids(request))
    return JsonResponse({"rows": [
        {"id": row["run"].pk, "status": row["run"].status,
         "html": render_to_string("runs/_row.html", row, request=request)}
        for row in rows]})


@login_required
def run_page(request, run_id: int):
    run = _run_or_404(request, run_id)
    actions = run_actions_by_status(user=request.user, run=run)
    context = {
        "run": run,
        "attempts": run_attempt_list(run=run),
        "actions": actions[run.status],
        # Hidden until the run gets to a status that offers them (live, by run_page/status.js).
        "actions_rendered": {action for status in _reachable(run.status) for action in actions[status]},
        "actions_json": json.dumps(actions),
        "statuses_json": json.dumps(RUN_PAGE_STATUSES),
        "config_json": json.dumps(run.config, indent=2, sort_keys=True),
        "metrics_url": reverse("api-run-metrics", args=[run.pk]),
        "run_url": reverse("api-run-detail", args=[run.pk]),
        "websocket_path": run_websocket_path(run.pk),
        "traces_url": reverse("api-run-traces", args=[run.pk]),
        "max_trace_steps": MAX_TRACE_STEPS,
        # Pages of their own, served by other parts of the dashboard.
        "timeline_url": reverse("run-timeline-page", args=[run.pk]),
        "devices_url": reverse("devices-page"),
        "charts": run_charts(run.config),
        "sft_data": _sft_data(run),
        "evaluation_table": _evaluation_table(run),
        # What the trainer waited on, in words; the page asks again as steps come.
        "idle": idle_summary(run=run),
        # Viewers see no cancel button; the cancel view refuses them anyway.
        "can_write": project_role(user=request.user, project=run.project)
        in Membership.WRITER_ROLES,
        "explorer": _metric_explorer("run", [run]),
        "memory_plan": run_memory_plan(run, trainer_device=trainer_device_memory()),
        # Alert rules whose condition holds on the run now; run_page/status.js keeps them current.
        "alerts": run_alerts_active(run_id=run.pk),
        "overview": _run_overview(run),
    }
    return render(request, "runs/detail.html", context)


# The series the run overview sums up, and those of them where lower is better.
OVERVIEW_METRICS = (REWARD_METRIC, SUCCESS_RATE_METRIC, LOSS_METRIC,
                    EVALUATION_METRIC_PREFIX + EVALUATION_SUCCESS_RATE)
OVERVIEW_LOWER_IS_BETTER = (LOSS_METRIC,)


def _run_overview(run: Run) -> dict:
    """What the run page opens with: progress, duration and ETA, each summed-up series at its end and its
    best, what the config changes from the defaults, and the whole config as a tree marked where it differs."""
    summarised = run_list_summarised(Run.objects.filter(pk=run.pk)).get()
    return {
        "summary": run_summary(summarised),
        "metrics": metric_summaries(run=run, names=OVERVIEW_METRICS, lower_is_better=OVERVIEW_LOWER_IS_BETTER),
        "changes": config_review(config_form(), run.config),
        "config_tree": config_tree(run.config, RunConfig().model_dump(mode="json")),
    }


@login_required
@require_GET
def run_facts_page(request, run_id: int):
    """The run page's facts that change with its attempts (a resume, a restart, a claim): when it started,
    its trainer, and its attempts as the page draws them (runs/_attempts.html); run_page/status.js asks on
    each change of status."""
    run = _run_or_404(request, run_id)
    return JsonResponse({
        "started": date_format(run.started_at, "Y-m-d H:i:s") or "—",
        "trainer": run.claimed_by or "—",
        "attempts_html": render_to_string("runs/_attempts.html", {"run": run, "attempts": run_attempt_list(run=run)},
                                          request=request),
    })


def _metric_explorer(page: str, runs: list[Run]) -> dict:
    """What runs/_metric_explorer.html gives metric_explorer.js: the page's kind and each run's URLs."""
    return {"page": page, "runs": [
        {"id": run.pk, "name": run.name, "names_url": reverse("api-run-metric-names", args=[run.pk]),
         "export_url": reverse("api-run-metric-export", args=[run.pk]),
         "series_url": reverse("api-run-metric-series", args=[run.pk]),
         # The RL-step axis of a bucketed panel is its trainer step less these (as metric_table counts it).
         "sft_steps": int(run.config.get("sft_steps") or 0)}
        for run in runs
    ]}


_PASS_AT_K = re.compile(r"pass@(\d+)")


def _evaluation_table(run: Run) -> dict | None:
    """The run's evaluations as the page's table; None without any.

    Success rate and mean reward, then a column per pass@k that any evaluation has
    (smallest k first), then the tool-use metrics if any evaluation's environment offers tools,
    then a dataset's held-out loss, perplexity and token accuracy if any evaluation is of a
    dataset; each cell its value and the 95% interval where there is one.
    """
    evaluations = list(evaluation_list(run=run).defer("trajectory_ids"))  # up to 100,000 ids each
    if not evaluations:
        return None
    pass_at_k = sorted({name for evaluation in evaluations for name in evaluation.metrics
                        if _PASS_AT_K.fullmatch(name)}, key=lambda name: int(name.removeprefix("pass@")))
    names = {name for evaluation in evaluations for name in evaluation.metrics}
    columns = [(name, evaluation_metric_label(name)) for name in (
        *EVALUATION_LEADING_METRICS, *pass_at_k, *(name for name in EVALUATION_TOOL_METRICS if name in names),
        *(name for name in DATASET_EVALUATION_METRICS if name in names))]
    rows = [
        {"evaluation": evaluation,
         "cells": [metric_cell(evaluation, name) for name, _ in columns]}
        for evaluation in evaluations
    ]
    return {"labels": [label for _, label in columns], "rows": rows}


def _sft_data(run: Run) -> dict | None:
    """What the SFT phase trains on (the pinned datasets, the demonstrations) and what it used so far.

    From the config and the trainer's SFT step metrics (trainer/datasets.py), stored as the step
    event's algorithm metrics are (``algorithm/sft/rows/<index>`` per dataset,
    ``algorithm/sft/rows/demonstrations``, ``algorithm/sft/tokens``). None without an SFT phase.
    """
    config = run.config
    if not config.get("sft_steps"):
        return None
    sft = config.get("sft") or {}
    totals = {name.removeprefix("algorithm/"): total
              for name, total in metric_totals(run=run, prefix="algorithm/sft/").items()}
    datasets = sft.get("datasets", [])
    ids = dict(Dataset.objects.filter(project=run.project, name__in=[entry["name"] for entry in datasets])
               .values_list("name", "pk"))
    sources = [{"label": f"{entry['name']}@{entry['version']}", "weight": entry["weight"],
                "dataset_id": ids.get(entry["name"]), "version": entry["version"],
                "rows": int(totals.get(f"sft/rows/{index}", (0, 0))[0])}
               for index, entry in enumerate(datasets)]
    weight = sft.get("demonstrations_weight")
    weight = (0.0 if datasets else 1.0) if weight is None else weight
    if weight > 0:
        rows = totals.get("sft/rows/demonstrations")
        sources.append({"label": f"demonstrations of {run.environment.name}", "weight": weight,
                        "rows": int(rows[0]) if rows else None})
    tokens, steps = totals.get("sft/tokens", (0.0, 0))
    return {"sources": sources, "steps": steps, "steps_planned": config["sft_steps"], "tokens": int(tokens)}


def run_actions_by_status(*, user, run: Run) -> dict[str, list[str]]:
    """Per status, the changes the run page offers: none unless the user's role may write."""
    if project_role(user=user, project=run.project) not in Membership.WRITER_ROLES:
        return {status: [] for status in Run.Status.values}
    offered = {}
    for status in Run.Status.values:
        allowed = LEGAL_TRANSITIONS[status]
        offered[status] = [action for action, to_status in _ACTION_TRANSITIONS if to_status in allowed
                           and (action != "resume" or status in RELEASED_RUN_STATUSES)]
        offered[status].append("clone")
        # A trace is of the trainer's next steps: only a run a trainer holds has them for sure.
        if status in TRAINER_HELD_RUN_STATUSES:
            offered[status].append("trace")
    return offered


def _reachable(status: str) -> set[str]:
    """``status`` and every status the run can still get to from it."""
    seen, frontier = {status}, [status]
    while frontier:
        for following in LEGAL_TRANSITIONS[frontier.pop()]:
            if following not in seen:
                seen.add(following)
                frontier.append(following)
    return seen


# The statuses the run page's scripts (run_page/) tell apart besides the contracts' vocabulary that
# base.html gives every page: waiting, it waits for its environment version's probe or for a trainer.
RUN_PAGE_STATUSES = {"waiting": [RunStatus.QUEUED]}

# A page action and the status it moves the run to.
_ACTION_TRANSITIONS = (("pause", Run.Status.PAUSED), ("resume", Run.Status.QUEUED),
                       ("cancel", Run.Status.CANCELLED))


def _run_action_page(request, run_id: int, service, done: str):
    run = _run_or_404(request, run_id)
    try:
        service(user=request.user, run=run)
    except Forbidden as error:
        raise PermissionDenied(error.message) from None
    except DomainError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, f"Run {run.name} {done}.")
    return redirect("run-page", run_id=run.pk)


@login_required
@require_POST
def run_cancel_page(request, run_id: int):
    if not action_confirmed(request):
        run = _run_or_404(request, run_id)
        if project_role(user=request.user, project=run.project) not in Membership.WRITER_ROLES:
            raise PermissionDenied("Viewers cannot cancel runs.")
        return confirmation_page(
            request, question=f"Cancel run {run.name} #{run.pk}?",
            consequence="It stops for good: a cancelled run cannot be resumed (clone it to train again).",
            confirm_label="Cancel run", back_url=reverse("run-page", args=[run.pk]))
    return _run_action_page(request, run_id, run_cancel, "cancelled")


@login_required
@require_POST
def run_pause_page(request, run_id: int):
    return _run_action_page(request, run_id, run_pause, "paused: the trainer checkpoints and lets go of it")


@login_required
@require_POST
def run_resume_page(request, run_id: int):
    return _run_action_page(request, run_id, run_resume, "queued again: it continues from its last checkpoint")


@login_required
@require_http_methods(["GET", "POST"])
def run_clone_page(request, run_id: int):
    """The new-run form, prefilled from the run's config ("clone from run")."""
    run = _run_or_404(request, run_id)
    form = RunCloneForm(request.POST or None, run=run)
    if request.method == "POST" and form.is_valid():
        try:
            clone = run_clone(user=request.user, run=run, config_changes=form.cleaned_data["config"],
                              name=form.cleaned_data["name"])
        except DomainError as error:
            form.add_domain_error(error)
        else:
            messages.success(request, f"Run {clone.name} queued, cloned from {run.name}.")
            return redirect("run-page", run_id=clone.pk)
    return render(request, "runs/clone.html", {"run": run, "form": form})


@login_required
def run_compare_page(request):
    """Overlaid charts of the runs named by ``?runs=1,2,3`` (the user's runs only, the first
    ``MAX_COMPARED_RUNS``), and the keys of their configs that differ."""
    requested = []
    for raw in request.GET.get("runs", "").split(","):
        if raw.strip().isdigit() and int(raw) not in requested:
            requested.append(int(raw))
    left_out = requested[MAX_COMPARED_RUNS:]
    requested = requested[:MAX_COMPARED_RUNS]
    runs = list(run_list(user=request.user).filter(pk__in=requested))
    runs.sort(key=lambda run: requested.index(run.pk))
    series = [
        {"id": run.pk, "name": run.name, "metrics_url": reverse("api-run-metrics", args=[run.pk])}
        for run in runs
    ]
    return render(request, "runs/compare.html", {
        "runs": runs, "series": series, "runs_left_out": len(left_out), "max_compared_runs": MAX_COMPARED_RUNS,
        "config_differences": config_differences([run.config for run in runs]) if len(runs) > 1 else [],
        "explorer": _metric_explorer("compare", runs), "compare_charts": COMPARE_CHARTS,
    })


@login_required
@require_http_methods(["GET", "POST"])
def run_new_page(request):
    """The new-run form generated from RunConfig's schema; ``?clone=<run id>`` prefills it from a run.

    A POST creates the run through ``run_create``; when anything is wrong, every error comes
    back at once (inputs that did not parse and RunConfig's verdict on the rest), each at its field.
    """
    form = config_form()
    writable = [project for project in project_list(user=request.user)
                if project.role in Membership.WRITER_ROLES]
    if not writable:
        raise PermissionDenied("You may start runs only in a project where you are an owner or a member.")
    environments = environment_list(user=request.user).filter(project__in=writable)
    options = _environment_options(environments)
    clone = None
    if request.GET.get("clone", "").isdigit():
        clone = _run_or_404(request, int(request.GET["clone"]))
    state = form_state(form, clone.config if clone else None)
    errors: dict[str, list[str]] = {}
    form_errors: list[str] = []
    name = f"{clone.name} (clone)"[:200] if clone else ""
    picked = f"{clone.project_id}:{clone.environment.name}@{clone.environment_version.number}" if clone else ""
    if request.method == "POST":
        name = request.POST.get("name", "").strip()[:200]
        picked = request.POST.get("environment", "")
        submitted = config_from_form(request.POST, form)
        state, errors = submitted.state, submitted.errors
        project_id, _, environment_name = picked.partition(":")
        if not project_id.isdigit() or not environment_name:
            errors.setdefault("environment", []).append("Pick an environment.")
        try:
            if errors:
                # Nothing is created, but RunConfig still names what else is wrong.
                run_config_normalise(submitted.changes)
            else:
                project = project_get_for_user(user=request.user, project_id=int(project_id))
                run = run_create(user=request.user, project=project, environment_name=environment_name,
                                 config=submitted.changes, name=name)
        except Forbidden as error:
            raise PermissionDenied(error.message) from None
        except DomainError as error:
            _errors_by_field(error, form, submitted, errors, form_errors)
        else:
            if not errors:
                messages.success(request, f"Run {run.name} queued.")
                return redirect("run-page", run_id=run.pk)
    if not picked:
        picked = next((option["value"] for option in options if not option["disabled"]), "")
    sections = bind_form(form, state, errors)
    presets = form_presets(form, model_roots=settings.TANDEM_MODEL_ROOTS)
    summary = [
        *(ErrorEntry("Environment", "id_environment", message) for message in errors.get("environment", [])),
        *(ErrorEntry("Name", "id_name", message) for message in errors.get("name", [])),
        *error_summary(sections),
    ]
    context = {
        "basic": sections[0],
        "advanced": sections[1:],
        "options": options,
        "picked": next((option for option in options if option["value"] == picked), None),
        "picked_value": picked,
        "environment_errors": errors.get("environment", []),
        "name_errors": errors.get("name", []),
        "form_errors": form_errors + errors.get("", []),
        "error_summary": summary,
        "name": name,
        "clone": clone,
        "error_count": len(summary) + len(form_errors) + len(errors.get("", [])),
        "schema_url": reverse("api-run-config-schema"),
        "validate_url": reverse("run-new-validate-page"),
        "presets": presets,
        "preset_inputs": {preset.key: {"label": preset.label, "inputs": preset.inputs} for preset in presets},
        "model_choices": [str(path) for path in model_directories(settings.TANDEM_MODEL_ROOTS)],
    }
    return render(request, "runs/new.html", context, status=400 if errors or form_errors else 200)


@login_required
@require_POST
def run_new_validate_page(request):
    """The new-run form's config checked as a submit would check it, creating nothing.

    The page calls it when a field loses focus and before its review step, so rules across
    fields (num_heads must divide d_model) show before the submit. ``{"errors": {<field path
    or section>: [...]}, "form_errors": [...], "review": [{"path", "label", "default",
    "value"}, ...]}``: every error at once; the review (what differs from the defaults) only
    when there is none. The submit validates again.
    """
    form = config_form()
    submitted = config_from_form(request.POST, form)
    errors, form_errors, review = submitted.errors, [], []
    project_id, _, environment_name = request.POST.get("environment", "").partition(":")
    try:
        if project_id.isdigit() and environment_name and not errors:
            # As Start will check it: datasets and the environment's demonstrations too.
            project = project_get_for_user(user=request.user, project_id=int(project_id))
            _, normalised = run_config_check(user=request.user, project=project,
                                             environment_name=environment_name, config=submitted.changes)
        else:
            normalised = run_config_normalise(submitted.changes)
    except Forbidden as error:
        raise PermissionDenied(error.message) from None
    except DomainError as error:
        _errors_by_field(error, form, submitted, errors, form_errors)
    else:
        if not errors:
            review = config_review(form, normalised)
    return JsonResponse({"errors": errors, "form_errors": form_errors, "review": review})


def _environment_options(environments) -> list[dict]:
    """One picker option per environment version, newest first, with its health; failed ones disabled."""
    versions = [version for environment in environments for version in environment.versions.all()]
    probed = environment_version_last_probe_times(versions=versions)
    options = []
    for environment in environments:
        for version in environment.versions.all():
            options.append({
                "value": f"{environment.project_id}:{environment.name}@{version.number}",
                "label": f"{environment.name} v{version.number}",
                "project": environment.project.name,
                "status": version.status,
                "status_label": version.get_status_display(),
                "reason": version.status_reason,
                "probed_at": probed.get(version.pk),
                "disabled": version.status == EnvironmentVersion.Status.FAILED,
            })
    return options


def _errors_by_field(error: DomainError, form, submitted, errors: dict[str, list[str]], form_errors: list[str]) -> None:
    """Put a service error next to the input it names: ``config.algorithm.epsilon_high`` -> that field.

    An error about a section (a model validator's, e.g. ``config.model``) shows on its fieldset, one
    about a row's cell (``config.sft.datasets.1.weight``) at that cell; one about the whole config,
    or a field not on the form, shows above the form. A field that did not parse keeps its own
    message: RunConfig only saw its default.
    """
    paths = {node.path for node in form.walk() if node.path} | set(submitted.row_paths())
    inputs = {f"config.{path}": path for path in paths} | {"environment": "environment", "name": "name"}
    unparsed = set(submitted.errors)
    for input_name, message in error_placements(error, inputs=inputs):
        if input_name is None:
            form_errors.append(message)
        elif input_name not in unparsed:
            errors.setdefault(input_name, []).append(message)


def _run_or_404(request, run_id: int):
    try:
        return run_get_for_user(user=request.user, run_id=run_id)
    except NotFound as error:
        raise Http404(error.message) from None
