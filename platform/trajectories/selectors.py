"""Reads of trajectory samples; callers pass a run the user may see (runs.selectors)."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Q, QuerySet

from common.domain_errors import InvalidInput, NotFound
from runs.models import Run

from .models import TrajectorySample

#: The trajectory browser's tool-use filter: each choice, what it says, and the samples it keeps.
TOOL_USE_FILTERS: dict[str, tuple[str, Q]] = {
    "called": ("called a tool", Q(tool_calls_run__gt=0)),
    "not_called": ("called no tool", Q(tool_calls_run=0)),
    "unparsed": ("a call failed to parse", Q(tool_calls_unparsed__gt=0)),
    "failed": ("a call did not run", Q(tool_calls_failed__gt=0)),
}


@dataclass(frozen=True)
class TrajectoryFilters:
    status: str | None = None
    environment: str | None = None
    purpose: str | None = None
    min_reward: float | None = None
    max_reward: float | None = None
    # Text in any of its turns, any case.
    text: str | None = None
    # A key of TOOL_USE_FILTERS.
    tool_use: str | None = None


def trajectory_sample_list(*, run: Run, filters: TrajectoryFilters = TrajectoryFilters()) -> QuerySet[TrajectorySample]:
    """The run's samples matching ``filters``, newest step first, without their turns."""
    samples = TrajectorySample.objects.filter(run=run)
    if filters.status is not None:
        if filters.status not in TrajectorySample.Status.values:
            raise InvalidInput.for_field(
                "status",
                f"Unknown status '{filters.status}'; one of {', '.join(TrajectorySample.Status.values)}.",
            )
        samples = samples.filter(status=filters.status)
    if filters.environment is not None:
        samples = samples.filter(environment=filters.environment)
    if filters.purpose is not None:
        samples = samples.filter(purpose=filters.purpose)
    if filters.min_reward is not None:
        samples = samples.filter(reward__gte=filters.min_reward)
    if filters.max_reward is not None:
        samples = samples.filter(reward__lte=filters.max_reward)
    if filters.text:
        samples = samples.filter(search_text__icontains=filters.text)
    if filters.tool_use is not None:
        if filters.tool_use not in TOOL_USE_FILTERS:
            raise InvalidInput.for_field(
                "tool_use", f"Unknown tool use '{filters.tool_use}'; one of {', '.join(TOOL_USE_FILTERS)}.")
        samples = samples.filter(TOOL_USE_FILTERS[filters.tool_use][1])
    return samples.defer("payload", "search_text").order_by("-step", "-id")


def trajectory_sample_get(*, run: Run, trajectory_id: str) -> TrajectorySample:
    sample = TrajectorySample.objects.filter(run=run, trajectory_id=trajectory_id).first()
    if sample is None:
        raise NotFound(f"Trajectory {trajectory_id} of run {run.pk} not found.")
    return sample


def trajectory_environments(*, run: Run) -> list[str]:
    """Environments the run's samples come from, for the browser's filter."""
    return list(
        TrajectorySample.objects.filter(run=run).order_by("environment")
        .values_list("environment", flat=True).distinct()
    )


def trajectory_group_get(*, run: Run, group_id: str) -> list[TrajectorySample]:
    """The sampled episodes of one group of ``run``, highest advantage (then reward) first.

    Failed episodes, which have no advantage, come last. A group with no sample is not found.
    """
    samples = list(TrajectorySample.objects.filter(run=run, group_id=group_id).defer("search_text"))
    if not samples:
        raise NotFound(f"Group {group_id} of run {run.pk} has no sampled trajectories.")
    samples.sort(key=lambda sample: (sample.advantage is None, -(sample.advantage or 0.0), -sample.reward,
                                     sample.trajectory_id))
    return samples
