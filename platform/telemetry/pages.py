"""The dashboard's timeline page: a run's trainer steps and producer episodes on one time axis."""

from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import render
from django.urls import reverse

from domain_errors import NotFound
from runs.selectors import run_get_for_user

from .serializers import DEFAULT_TIMELINE_STEPS, MAX_TIMELINE_STEPS


@login_required
def run_timeline_page(request, run_id: int):
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
    }
    return render(request, "runs/timeline.html", context)
