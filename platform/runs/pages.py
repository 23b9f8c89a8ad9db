"""The dashboard's run pages: server-rendered templates; charts fill in from run_page.js."""

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from accounts.models import Membership
from accounts.selectors import project_get_for_user, project_list, project_role
from domain_errors import DomainError, Forbidden, NotFound
from environments.selectors import environment_list

from .forms import RunCloneForm, RunCreateForm
from .models import Run
from .realtime import run_websocket_path
from .selectors import run_get_for_user, run_list, run_search
from .services import LEGAL_TRANSITIONS, run_cancel, run_clone, run_create, run_pause, run_resume

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
    filters = {key: request.GET.get(key, "").strip() for key in ("status", "environment", "q")}
    sort = request.GET.get("sort") or "-created"
    try:
        runs = run_search(user=request.user, status=filters["status"] or None,
                          environment=filters["environment"] or None, name_contains=filters["q"] or None,
                          sort=sort)
    except DomainError as error:
        messages.error(request, error.message)
        filters, sort = {"status": "", "environment": "", "q": ""}, "-created"
        runs = run_search(user=request.user)
    query = request.GET.copy()
    query.pop("sort", None)
    columns = [
        {"key": key, "label": label, "sort": key if sort != key else f"-{key}",
         "arrow": "▲" if sort == key else "▼" if sort == f"-{key}" else ""}
        for key, label in (("name", "Run"), ("environment", "Environment"), ("status", "Status"),
                           ("step", "Step"), ("policy", "Policy"), ("created", "Created"))
    ]
    context = {
        "runs": runs[:RUNS_SHOWN],
        "form": form,
        "filters": filters,
        "statuses": Run.Status.values,
        "environments": sorted({environment.name for environment in environment_list(user=request.user)}),
        "columns": columns,
        "sort": sort if request.GET.get("sort") else "",  # kept by the filter form
        "query": query.urlencode(),
        "runs_api_url": reverse("api-runs"),
        "compare_url": reverse("run-compare-page"),
    }
    return render(request, "runs/list.html", context)


@login_required
def run_page(request, run_id: int):
    run = _run_or_404(request, run_id)
    actions = run_actions_by_status(user=request.user, run=run)
    context = {
        "run": run,
        "actions": actions[run.status],
        # Hidden until the run gets to a status that offers them (live, by run_page.js).
        "actions_rendered": {action for status in _reachable(run.status) for action in actions[status]},
        "actions_json": json.dumps(actions),
        "config_json": json.dumps(run.config, indent=2, sort_keys=True),
        "metrics_url": reverse("api-run-metrics", args=[run.pk]),
        "run_url": reverse("api-run-detail", args=[run.pk]),
        "websocket_path": run_websocket_path(run.pk),
        # Viewers see no cancel button; the cancel view refuses them anyway.
        "can_write": project_role(user=request.user, project=run.project)
        in Membership.WRITER_ROLES,
    }
    return render(request, "runs/detail.html", context)


def run_actions_by_status(*, user, run: Run) -> dict[str, list[str]]:
    """Per status, the changes the run page offers: none unless the user's role may write."""
    if project_role(user=user, project=run.project) not in Membership.WRITER_ROLES:
        return {status: [] for status in Run.Status.values}
    offered = {}
    for status in Run.Status.values:
        allowed = LEGAL_TRANSITIONS[status]
        offered[status] = [action for action, to_status in _ACTION_TRANSITIONS if to_status in allowed]
        offered[status].append("clone")
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
    """Overlaid charts of the runs named by ``?runs=1,2,3`` (the user's runs only)."""
    requested = []
    for raw in request.GET.get("runs", "").split(","):
        if raw.strip().isdigit() and int(raw) not in requested:
            requested.append(int(raw))
    runs = list(run_list(user=request.user).filter(pk__in=requested))
    runs.sort(key=lambda run: requested.index(run.pk))
    series = [
        {"id": run.pk, "name": run.name, "metrics_url": reverse("api-run-metrics", args=[run.pk])}
        for run in runs
    ]
    return render(request, "runs/compare.html", {"runs": runs, "series": series})


def _run_or_404(request, run_id: int):
    try:
        return run_get_for_user(user=request.user, run_id=run_id)
    except NotFound as error:
        raise Http404(error.message) from None
