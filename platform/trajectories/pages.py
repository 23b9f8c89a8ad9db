"""The trajectory browser: a run's sampled trajectories, and one conversation turn by turn."""

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import render

from common.domain_errors import DomainError, NotFound
from runs.selectors import run_get_for_user

from .selectors import (
    TOOL_USE_FILTERS,
    TrajectoryFilters,
    trajectory_environments,
    trajectory_group_get,
    trajectory_sample_get,
    trajectory_sample_list,
)
from .serializers import TrajectoryFiltersSerializer, sample_for_page

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
        "filters": {key: request.GET.get(key, "")
                    for key in ("status", "purpose", "environment", "min_reward", "max_reward", "q", "tool_use")},
        "filter_errors": errors,
        "tool_use_choices": [(name, label) for name, (label, _) in TOOL_USE_FILTERS.items()],
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
    record = sample_for_page(sample)
    context = {
        "run": run,
        "sample": sample,
        "record": record,
        "turns": _turns(record),
        "token_values": record.token_values,
        "policy_versions": record.policy_versions,
        "group_id": record.group_id,
        "duration_s": record.finished_at - record.started_at,
    }
    return render(request, "trajectories/detail.html", context)


@login_required
def trajectory_group_page(request, run_id: int, group_id: str):
    run = _run_or_404(request, run_id)
    try:
        samples = trajectory_group_get(run=run, group_id=group_id)
    except NotFound as error:
        raise Http404(error.message) from None
    episodes = [{"sample": sample, "record": (record := sample_for_page(sample)), "turns": _turns(record)}
                for sample in samples]
    context = {
        "run": run,
        "group_id": group_id,
        "group_size": next((sample.group_size for sample in samples if sample.group_size), None),
        "steps": sorted({sample.step for sample in samples}),
        "episodes": episodes,
        "token_values": "included" if any(episode["record"].token_values == "included" for episode in episodes)
        else episodes[0]["record"].token_values,
    }
    return render(request, "trajectories/group.html", context)


def _turns(record) -> list[dict]:
    """The sample's turns as the templates show them, each token with its values when it has them.

    Samples of conversations with messages (chat templates) show each message's text, their
    tokens folded away; older samples and the byte layout show the tokens themselves.
    """
    turns = []
    for turn in record.turns:
        spans = [{"text": span.text, "tokens": span.tokens, "trained": span.trained,
                  # Values as data attributes, written without the locale's formatting.
                  "token_values": [
                      {"text": piece, "logprob": f"{span.logprobs[index]:.6g}",
                       "advantage": f"{span.advantages[index]:.6g}" if span.advantages else ""}
                      for index, piece in enumerate(span.pieces)]}
                 for span in turn.spans]
        turns.append({
            "role": turn.role, "text": turn.text, "policy_version": turn.policy_version,
            "tool_calls": turn.tool_calls, "spans": spans, "message": record.by_message,
            # Only a call that came to nothing: "ok" goes without saying beside the calls.
            "tool_call_problem": turn.tool_call_status if turn.tool_call_status not in (None, "ok") else None,
            "tool_call_error": turn.tool_call_error,
            "agent_call": turn.agent_call,
            "tokens": sum(span.tokens for span in turn.spans),
            "trained_tokens": sum(span.tokens for span in turn.spans if span.trained),
        })
    return turns


def _run_or_404(request, run_id: int):
    try:
        return run_get_for_user(user=request.user, run_id=run_id)
    except NotFound as error:
        raise Http404(error.message) from None
