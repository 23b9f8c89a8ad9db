"""The dashboard's sweep pages: the caller's sweeps with a form to start one, and one sweep's trials."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from accounts.selectors import project_get_for_user, project_list
from common.domain_errors import DomainError, Forbidden, NotFound

from .forms import SweepForm
from .selectors import sweep_details, sweep_get_for_user, sweep_list
from .services import sweep_cancel, sweep_create


@login_required
@require_http_methods(["GET", "POST"])
def sweep_list_page(request):
    form = SweepForm(request.POST or None, projects=project_list(user=request.user))
    if request.method == "POST" and form.is_valid():
        try:
            project = project_get_for_user(user=request.user, project_id=int(form.cleaned_data["project"]))
            sweep = sweep_create(user=request.user, project=project, **form.service_arguments())
        except Forbidden as error:
            raise PermissionDenied(error.message) from None
        except DomainError as error:
            form.add_domain_error(error)
        else:
            messages.success(request, f"Sweep '{sweep.name}' started.")
            return redirect("sweep-page", sweep_id=sweep.pk)
    return render(request, "sweeps/list.html", {"sweeps": sweep_list(user=request.user), "form": form})


def _sweep_or_404(request, sweep_id: int):
    try:
        return sweep_get_for_user(user=request.user, sweep_id=sweep_id)
    except NotFound as error:
        raise Http404(error.message) from None


@login_required
def sweep_page(request, sweep_id: int):
    sweep = _sweep_or_404(request, sweep_id)
    detail = sweep_details(sweeps=[sweep])[sweep.pk]
    importances, importances_reason = detail["importances"]
    parameters = list(sweep.search_space)
    chart = {"parameters": parameters, "metric": sweep.metric, "goal": sweep.goal, "trials": [
        {"number": trial.number, "params": trial.params, "value": trial.value, "state": trial.state}
        for trial in detail["trials"]]}
    return render(request, "sweeps/detail.html", {
        "sweep": sweep, "trials": detail["trials"], "best": detail["best"], "parameters": parameters,
        "importances": sorted(importances.items(), key=lambda item: -item[1]),
        "importances_reason": importances_reason, "chart": chart,
    })


@login_required
@require_POST
def sweep_cancel_page(request, sweep_id: int):
    sweep = _sweep_or_404(request, sweep_id)
    try:
        sweep_cancel(user=request.user, sweep=sweep)
    except Forbidden as error:
        raise PermissionDenied(error.message) from None
    messages.success(request, f"Sweep '{sweep.name}' cancelled.")
    return redirect("sweep-page", sweep_id=sweep.pk)
