"""The trajectory browser: a run's sampled trajectories, and one conversation turn by turn."""

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import render

from domain_errors import DomainError, NotFound
from runs.selectors import run_get_for_user

from .selectors import (
    TrajectoryFilters,
    trajectory_environments,
    trajectory_sample_get,
    trajectory_sample_list,
)
from .serializers import TrajectoryFiltersSerializer

SAMPLES_PER_PAGE = 50


@login_required
def trajectory_list_page(request, run_id: int):
    run = _run_or_404(request, run_id)
    # Empty inputs of the filter form mean "any".
    submitted = {key: value for key, value in request.GET.items() if value != "" and key != "page"}
    filters_form = TrajectoryFiltersSerializer(data=submitted)
    errors = {}
    filters = TrajectoryFilters()
    if filters_form.is_valid():
        filters = TrajectoryFilters(**filters_form.validated_data)
    else:
        errors = {field: " ".join(str(m) for m in messages) for field, messages in filters_form.errors.items()}
    try:
        samples = trajectory_sample_list(run=run, filters=filters)
    except DomainError as error:
        errors = {"status": error.message}
        samples = trajectory_sample_list(run=run)
    page = Paginator(samples, SAMPLES_PER_PAGE).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    context = {
        "run": run,
        "page": page,
        "filters": {key: request.GET.get(key, "") for key in ("status", "environment", "min_reward", "max_reward")},
        "filter_errors": errors,
        "environments": trajectory_environments(run=run),
        "query": query.urlencode(),
    }
    return render(request, "trajectories/list.html", context)


@login_required
def trajectory_page(request, run_id: int, trajectory_id: str):
    run = _run_or_404(request, run_id)
    try:
        sample = trajectory_sample_get(run=run, trajectory_id=trajectory_id)
    except NotFound as error:
        raise Http404(error.message) from None
    payload = sample.payload
    # Samples of conversations with messages (chat templates) show each message's text, their
    # tokens folded away; older samples and the byte layout show the tokens themselves.
    by_message = bool(payload.get("by_message"))
    turns = [
        {**turn, "message": by_message, "tokens": sum(span["tokens"] for span in turn["spans"]),
         "trained_tokens": sum(span["tokens"] for span in turn["spans"] if span["trained"])}
        for turn in payload.get("turns", [])
    ]
    context = {
        "run": run,
        "sample": sample,
        "turns": turns,
        "policy_versions": payload.get("policy_versions", []),
        "group_id": payload.get("group_id", ""),
        "duration_s": payload.get("finished_at", 0) - payload.get("started_at", 0),
    }
    return render(request, "trajectories/detail.html", context)


def _run_or_404(request, run_id: int):
    try:
        return run_get_for_user(user=request.user, run_id=run_id)
    except NotFound as error:
        raise Http404(error.message) from None
