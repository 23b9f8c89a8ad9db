"""The dashboard's telemetry pages: a run's timeline, and every active run's devices."""

from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from domain_errors import NotFound
from runs.selectors import run_get_for_user
from tandem.contracts import ACTIVE_RUN_STATUSES

from .charts import stage_styles
from .device_listings import active_run_devices, tandem_processes
from .serializers import DEFAULT_TIMELINE_STEPS, MAX_TIMELINE_STEPS

# How often the devices page asks again; the trainer reports every device_report_interval_s (10 s by default).
DEVICES_REFRESH_S = 5


@login_required
def run_timeline_page(request, run_id: int):
    """A run's trainer steps and producer episodes on one time axis (run_timeline.js draws it)."""
    try:
        run = run_get_for_user(user=request.user, run_id=run_id)
    except NotFound as error:
        raise Http404(error.message) from None
    context = {
        "run": run,
        # run_timeline.js draws from the API, polling while the run can still train.
        "timeline_url": reverse("api-run-timeline", args=[run.pk]),
        "default_steps": DEFAULT_TIMELINE_STEPS,
        "step_choices": [step for step in (20, 60, 120, MAX_TIMELINE_STEPS) if step <= MAX_TIMELINE_STEPS],
        # The trainer lane's stages, and the statuses in which the run can still train (it polls while so).
        "stages": stage_styles(),
        "active_statuses": sorted(ACTIVE_RUN_STATUSES),
    }
    return render(request, "runs/timeline.html", context)


@login_required
@require_GET
def devices_page(request):
    """Every active run's devices and every Tandem process, refreshed from ``/api/devices/`` and
    ``/api/processes/`` by devices.js."""
    return render(request, "devices/list.html", {
        "active_runs": active_run_devices(user=request.user),
        "processes": tandem_processes(user=request.user),
        "refresh_ms": DEVICES_REFRESH_S * 1000,
    })
