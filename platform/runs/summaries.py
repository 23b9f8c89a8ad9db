"""Reads for the run list's summary columns: progress, reward, duration and ETA.

The figures come from the run row and its telemetry, added to the list's own query as
subqueries, so a page of a hundred runs is still one query (pinned in
tests/platform/test_run_list_workspace.py).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from django.db.models import Count, F, FloatField, Max, Min, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce, Now
from django.utils import timezone

from tandem.contracts import REWARD_MEAN_METRIC
from telemetry.models import MetricPoint, StepTimelineRecord

from .models import Run

# The series the list reports as the run's reward: the mean episode reward of an RL step.
REWARD_METRIC = REWARD_MEAN_METRIC
# The step rate behind the ETA is measured over the run's newest steps with a timeline record:
# recent enough to follow a change of pace (SFT to RL), long enough to smooth one slow step.
STEP_RATE_WINDOW = 20
PHASES = ("sft", "rl")  # tandem.contracts' TrainerStepEvent.phase


def _latest_reward() -> Subquery:
    """The outer run's reward at its newest RL step (the list's reward column, and its sort)."""
    rewards = MetricPoint.objects.filter(run=OuterRef("pk"), name=REWARD_METRIC).order_by("-step")
    return Subquery(rewards.values("value")[:1], output_field=FloatField())


def run_list_summarised(runs: QuerySet[Run]) -> QuerySet[Run]:
    """``runs`` with what :func:`run_summary` needs, read in the same query."""
    rewards = MetricPoint.objects.filter(run=OuterRef("pk"), name=REWARD_METRIC)
    annotations = {
        "latest_reward": _latest_reward(),
        "best_reward": Subquery(
            rewards.order_by().values("run").annotate(best=Max("value")).values("best"), output_field=FloatField()
        ),
    }
    # A rate per phase: an RL step (rollouts, then the update) is often several times an SFT step.
    for phase in PHASES:
        recent_steps = (
            StepTimelineRecord.objects.filter(run=OuterRef("pk"), phase=phase,
                                              step__gt=OuterRef("trainer_step") - STEP_RATE_WINDOW)
            .order_by()
            .values("run")
        )
        annotations |= {
            f"recent_{phase}_steps_counted": Subquery(recent_steps.annotate(count=Count("step")).values("count")),
            f"recent_{phase}_steps_started_at": Subquery(
                recent_steps.annotate(first=Min("started_at")).values("first"), output_field=FloatField()
            ),
            f"recent_{phase}_steps_ended_at": Subquery(
                recent_steps.annotate(last=Max("ended_at")).values("last"), output_field=FloatField()
            ),
        }
    return runs.annotate(**annotations)


def _seconds_per_step(run: Run, phase: str) -> float | None:
    """Seconds per ``phase`` step over the run's newest steps; None before two such steps are recorded."""
    counted = getattr(run, f"recent_{phase}_steps_counted", None) or 0
    started, ended = (getattr(run, f"recent_{phase}_steps_{end}_at", None) for end in ("started", "ended"))
    if counted >= 2 and ended > started:
        return (ended - started) / counted
    return None


@dataclass(frozen=True)
class RunSummary:
    sft_done: int
    sft_planned: int
    rl_done: int
    rl_planned: int
    latest_reward: float | None
    best_reward: float | None
    duration: datetime.timedelta | None
    # Seconds per step of the phase the run is in, over its newest steps; None before two are recorded.
    seconds_per_step: float | None
    eta: datetime.timedelta | None
    # True while RL steps are left and none is timed yet: the ETA counts only the SFT steps left then.
    eta_at_least: bool = False

    @property
    def progress_label(self) -> str:
        rl = f"RL {self.rl_done}/{self.rl_planned}"
        return f"SFT {self.sft_done}/{self.sft_planned} · {rl}" if self.sft_planned else rl

    @property
    def duration_label(self) -> str:
        return _span_label(self.duration)

    @property
    def eta_label(self) -> str:
        return f"≥ {_span_label(self.eta)}" if self.eta_at_least else _span_label(self.eta)

    @property
    def eta_title(self) -> str:
        if self.eta_at_least:
            return "the SFT steps left only: no RL step is timed yet, and an RL step is often several SFT steps"
        return f"{self.seconds_per_step:.2f} s per step recently" if self.seconds_per_step is not None else ""


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
    the end (or now); the ETA is each phase's steps left at that phase's recent step rate, only
    while the run can still train. Before an RL step is timed, it is a lower bound: the SFT steps
    left (``eta_at_least``).
    """
    now = now or timezone.now()
    sft_planned = int(run.config.get("sft_steps") or 0)
    rl_planned = int(run.config.get("rl_steps") or 0)
    sft_done = min(run.trainer_step, sft_planned)
    rl_done = min(max(run.trainer_step - sft_planned, 0), rl_planned)
    duration = None
    if run.started_at is not None:
        duration = (run.finished_at or now) - run.started_at
    sft_rate, rl_rate = _seconds_per_step(run, "sft"), _seconds_per_step(run, "rl")
    sft_left, rl_left = sft_planned - sft_done, rl_planned - rl_done
    eta, eta_at_least = None, False
    if not run.is_terminal:
        if sft_left and sft_rate is not None:
            eta_s = sft_left * sft_rate
            if rl_left and rl_rate is None:
                eta_at_least = True
            else:
                eta_s += rl_left * (rl_rate or 0.0)
            eta = datetime.timedelta(seconds=round(eta_s))
        elif not sft_left and rl_rate is not None:
            eta = datetime.timedelta(seconds=round(rl_left * rl_rate))
    return RunSummary(
        sft_done=sft_done, sft_planned=sft_planned, rl_done=rl_done, rl_planned=rl_planned,
        latest_reward=getattr(run, "latest_reward", None), best_reward=getattr(run, "best_reward", None),
        duration=duration, seconds_per_step=sft_rate if sft_left else rl_rate, eta=eta, eta_at_least=eta_at_least,
    )


#: The list's sorts by a summary column (the others are run_search's, by the run's own fields).
SUMMARY_SORTS = ("reward", "duration")


def run_list_sort(runs: QuerySet[Run], sort: str) -> QuerySet[Run]:
    """``runs`` by a summary column of :data:`SUMMARY_SORTS` (``-`` first: descending): the newest RL
    step's reward, or the time since the start. Runs without one (no RL step yet, not started) come last
    either way."""
    key, descending = sort.removeprefix("-"), sort.startswith("-")
    if key == "reward":
        runs = runs.annotate(sort_value=_latest_reward())
    elif key == "duration":
        runs = runs.annotate(sort_value=Coalesce("finished_at", Now()) - F("started_at"))
    else:
        raise ValueError(f"not a summary sort: {sort}")
    value = F("sort_value")
    return runs.order_by(value.desc(nulls_last=True) if descending else value.asc(nulls_last=True), "-id")
