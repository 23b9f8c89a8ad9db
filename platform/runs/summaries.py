"""Reads for the run list's summary columns: progress, reward, duration and ETA.

The figures come from the run row and its telemetry, added to the list's own query as
subqueries, so a page of a hundred runs is still one query (pinned in
tests/platform/test_run_list_workspace.py).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from django.db.models import Count, FloatField, Max, Min, OuterRef, QuerySet, Subquery
from django.utils import timezone

from tandem.contracts import REWARD_MEAN_METRIC
from telemetry.models import MetricPoint, StepTimelineRecord

from .models import Run

# The series the list reports as the run's reward: the mean episode reward of an RL step.
REWARD_METRIC = REWARD_MEAN_METRIC
# The step rate behind the ETA is measured over the run's newest steps with a timeline record:
# recent enough to follow a change of pace (SFT to RL), long enough to smooth one slow step.
STEP_RATE_WINDOW = 20


def run_list_summarised(runs: QuerySet[Run]) -> QuerySet[Run]:
    """``runs`` with what :func:`run_summary` needs, read in the same query."""
    rewards = MetricPoint.objects.filter(run=OuterRef("pk"), name=REWARD_METRIC)
    recent_steps = (
        StepTimelineRecord.objects.filter(run=OuterRef("pk"), step__gt=OuterRef("trainer_step") - STEP_RATE_WINDOW)
        .order_by()
        .values("run")
    )
    return runs.annotate(
        latest_reward=Subquery(rewards.order_by("-step").values("value")[:1], output_field=FloatField()),
        best_reward=Subquery(
            rewards.order_by().values("run").annotate(best=Max("value")).values("best"), output_field=FloatField()
        ),
        recent_steps_counted=Subquery(recent_steps.annotate(count=Count("step")).values("count")),
        recent_steps_started_at=Subquery(
            recent_steps.annotate(first=Min("started_at")).values("first"), output_field=FloatField()
        ),
        recent_steps_ended_at=Subquery(
            recent_steps.annotate(last=Max("ended_at")).values("last"), output_field=FloatField()
        ),
    )


@dataclass(frozen=True)
class RunSummary:
    sft_done: int
    sft_planned: int
    rl_done: int
    rl_planned: int
    latest_reward: float | None
    best_reward: float | None
    duration: datetime.timedelta | None
    # Seconds per step over the newest steps; None before two steps are recorded.
    seconds_per_step: float | None
    eta: datetime.timedelta | None

    @property
    def progress_label(self) -> str:
        rl = f"RL {self.rl_done}/{self.rl_planned}"
        return f"SFT {self.sft_done}/{self.sft_planned} · {rl}" if self.sft_planned else rl

    @property
    def duration_label(self) -> str:
        return _span_label(self.duration)

    @property
    def eta_label(self) -> str:
        return _span_label(self.eta)


def _span_label(span: datetime.timedelta | None) -> str:
    """``2h 05m``, ``4m 10s``, ``9s``; empty for None."""
    if span is None:
        return ""
    seconds = max(int(span.total_seconds()), 0)
    hours, minutes, seconds = seconds // 3600, seconds // 60 % 60, seconds % 60
    if hours:
        return f"{hours}h {minutes:02d}m"
    return f"{minutes}m {seconds:02d}s" if minutes else f"{seconds}s"


def run_summary(run: Run, *, now: datetime.datetime | None = None) -> RunSummary:
    """The run's summary columns, from a run of :func:`run_list_summarised`.

    ``trainer_step`` counts SFT steps first, then RL steps. Duration runs from the start to
    the end (or now); the ETA is the steps left at the recent step rate, only while the run
    can still train.
    """
    now = now or timezone.now()
    sft_planned = int(run.config.get("sft_steps") or 0)
    rl_planned = int(run.config.get("rl_steps") or 0)
    sft_done = min(run.trainer_step, sft_planned)
    rl_done = min(max(run.trainer_step - sft_planned, 0), rl_planned)
    duration = None
    if run.started_at is not None:
        duration = (run.finished_at or now) - run.started_at
    seconds_per_step = None
    counted = getattr(run, "recent_steps_counted", None) or 0
    if counted >= 2 and run.recent_steps_ended_at > run.recent_steps_started_at:
        seconds_per_step = (run.recent_steps_ended_at - run.recent_steps_started_at) / counted
    eta = None
    steps_left = sft_planned + rl_planned - sft_done - rl_done
    if seconds_per_step is not None and not run.is_terminal:
        eta = datetime.timedelta(seconds=round(steps_left * seconds_per_step))
    return RunSummary(
        sft_done=sft_done, sft_planned=sft_planned, rl_done=rl_done, rl_planned=rl_planned,
        latest_reward=getattr(run, "latest_reward", None), best_reward=getattr(run, "best_reward", None),
        duration=duration, seconds_per_step=seconds_per_step, eta=eta,
    )
