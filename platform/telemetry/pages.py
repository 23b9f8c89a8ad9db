"""The dashboard's telemetry pages: a run's timeline, and the devices: every active run's now, one run's over time."""

from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_GET

from common.domain_errors import NotFound
from runs.models import Run
from runs.selectors import run_get_for_user, run_list
from tandem.contracts import ACTIVE_RUN_STATUSES

from .charts import DEVICE_HISTORY_PANELS, stage_styles
from .device_listings import active_run_devices, tandem_processes
from .serializers import DEFAULT_TIMELINE_STEPS, MAX_TIMELINE_STEPS

# How often the devices page asks again; the trainer reports every device_report_interval_s (10 s by default).
DEVICES_REFRESH_S = 5
# The devices page's run picker lists this many of the newest runs (a run picked by ?run= is added).
DEVICE_HISTORY_PICKER_RUNS = 100


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
        # The trainer lane's stages (it polls while the run is in the contracts' active statuses,
        # which base.html gives every page's scripts).
        "stages": stage_styles(),
    }
    return render(request, "runs/timeline.html", context)


@login_required
@require_GET
def devices_page(request):
    """Every active run's devices and every Tandem process, refreshed from ``/api/devices/`` and
    ``/api/processes/`` by devices.js; and one run's devices, host and processes over time (``?run=``,
    by default the newest active run, else the newest), as metric explorer panels of its series."""
    runs = list(run_list(user=request.user)[:DEVICE_HISTORY_PICKER_RUNS])
    picked = _device_history_run(request, runs)
    if picked is not None and picked not in runs:
        runs.append(picked)  # older than every listed run, so the list stays newest first
    return render(request, "devices/list.html", {
        "active_runs": active_run_devices(user=request.user),
        "processes": tandem_processes(user=request.user),
        "refresh_ms": DEVICES_REFRESH_S * 1000,
        "history_runs": [
            {"id": run.pk, "name": run.name, "project": run.project.name, "status": run.status,
             "active": run.status in ACTIVE_RUN_STATUSES, "picked": run == picked}
            for run in runs
        ],
        "history_run_active": picked is not None and picked.status in ACTIVE_RUN_STATUSES,
        # What runs/_metric_explorer.html gives metric_explorer.js, as the run page gives it (runs.pages).
        "explorer": None if picked is None else {
            "page": "devices",
            "runs": [{"id": picked.pk, "name": picked.name,
                      "names_url": reverse("api-run-metric-names", args=[picked.pk]),
                      "export_url": reverse("api-run-metric-export", args=[picked.pk]),
                      # A long run's panels on the step axes read buckets, not every point.
                      "series_url": reverse("api-run-metric-series", args=[picked.pk]),
                      "sft_steps": int(picked.config.get("sft_steps") or 0)}],
        },
        "history_panels": DEVICE_HISTORY_PANELS,
    })


def _device_history_run(request, runs: list[Run]) -> Run | None:
    """The run ``?run=`` names (a 404 when it is not the user's), else the newest active one of
    ``runs``, else the newest; None for a user without runs."""
    requested = request.GET.get("run", "")
    if not requested:
        return next((run for run in runs if run.status in ACTIVE_RUN_STATUSES), runs[0] if runs else None)
    if not requested.isdigit():
        raise Http404(f"No run '{requested}'.")
    listed = next((run for run in runs if run.pk == int(requested)), None)
    if listed is not None:
        return listed
    try:
        return run_get_for_user(user=request.user, run_id=int(requested))
    except NotFound as error:
        raise Http404(error.message) from None
