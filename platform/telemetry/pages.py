"""The dashboard's devices page: every active run's devices, refreshed from ``/api/devices/`` by devices.js."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_GET

from .views import active_run_devices

# How often the page asks again; the trainer reports every device_report_interval_s (10 s by default).
REFRESH_S = 5


@login_required
@require_GET
def devices_page(request):
    return render(request, "devices/list.html", {
        "active_runs": active_run_devices(user=request.user),
        "refresh_ms": REFRESH_S * 1000,
    })
