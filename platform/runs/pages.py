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

from .forms import RunCreateForm
from .realtime import run_websocket_path
from .selectors import run_get_for_user, run_list
from .services import run_cancel, run_create

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
    runs = run_list(user=request.user)[:RUNS_SHOWN]
    return render(request, "runs/list.html", {"runs": runs, "form": form})


@login_required
def run_page(request, run_id: int):
    run = _run_or_404(request, run_id)
    context = {
        "run": run,
        "config_json": json.dumps(run.config, indent=2, sort_keys=True),
        "metrics_url": reverse("api-run-metrics", args=[run.pk]),
        "run_url": reverse("api-run-detail", args=[run.pk]),
        "websocket_path": run_websocket_path(run.pk),
        # Viewers see no cancel button; the cancel view refuses them anyway.
        "can_write": project_role(user=request.user, project=run.project)
        in Membership.WRITER_ROLES,
    }
    return render(request, "runs/detail.html", context)


@login_required
@require_POST
def run_cancel_page(request, run_id: int):
    run = _run_or_404(request, run_id)
    try:
        run_cancel(user=request.user, run=run)
    except Forbidden as error:
        raise PermissionDenied(error.message) from None
    except DomainError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, f"Run {run.name} cancelled.")
    return redirect("run-page", run_id=run.pk)


def _run_or_404(request, run_id: int):
    try:
        return run_get_for_user(user=request.user, run_id=run_id)
    except NotFound as error:
        raise Http404(error.message) from None
