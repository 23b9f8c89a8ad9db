"""Reads of telemetry: the backfill cursor, charts at a requested resolution, the timeline, traces, and
device reports."""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase

import pydantic
import redis
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db.models import (
    Count,
    ExpressionWrapper,
    F,
    IntegerField,
    Max,
    Min,
    QuerySet,
    Sum,
)
from django.db.models.functions import Mod

from common.domain_errors import NotFound
from runs.models import Run
from runs.selectors import run_list
from tandem.contracts import (
    IDLE_CAUSES,
    SAMPLES_PER_S_METRIC,
    TRAINER_HELD_RUN_STATUSES,
    ProcessReport,
    ProducerReport,
    SchemaVersionError,
    TraceRequest,
    producers_key,
)
from tandem.runtime.process_reports import live_process_reports_at

from .models import DeviceSnapshot, MetricBucket, MetricPoint, StepTimelineRecord, Trace

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MetricPage:
    points: list[tuple[int, str, float]]  # (step, name, value), ordered by step then name
    next_after_step: int | None  # the last step in ``points``; None when it is empty


def metric_points_after(
    *, run: Run, after_step: int, names: Sequence[str] | None = None, limit: int = 1000
) -> MetricPage:
    """Points of the steps after ``after_step``, about ``limit`` of them, whole steps only.

    A page never ends inside a step, so a client that asks again from
    ``next_after_step`` misses nothing. A single step with more than ``limit``
    points comes whole rather than not at all.
    """
    points = MetricPoint.objects.filter(run=run, step__gt=after_step)
    if names:
        points = points.filter(name__in=names)
    rows = list(points.order_by("step", "name").values_list("step", "name", "value")[: limit + 1])
    if len(rows) > limit:
        first_step_left_out = rows[limit][0]
        whole_steps = [row for row in rows[:limit] if row[0] != first_step_left_out]
        if whole_steps:
            rows = whole_steps
        else:
            rows = list(
                points.filter(step=first_step_left_out)
                .order_by("name")
                .values_list("step", "name", "value")
            )
    return MetricPage(points=rows, next_after_step=rows[-1][0] if rows else None)


@dataclass(frozen=True)
class MetricSeries:
    """One series as parallel columns, one entry per bucket (or per point when raw)."""

    first_step: list[int]
    last_step: list[int]
    count: list[int]
    min: list[float]
    max: list[float]
    mean: list[float]


@dataclass(frozen=True)
class MetricChart:
    from_step: int | None  # the range charted; None when the run has no points to chart
    to_step: int | None
    resolution: int  # steps per bucket; 1: raw points
    series: dict[str, MetricSeries]


def metric_chart(
    *,
    run: Run,
    points: int,
    names: Sequence[str] = (),
    from_step: int | None = None,
    to_step: int | None = None,
) -> MetricChart:
    """The series ``names`` (empty: every series of the run) over a step range, in at least
    ``points`` buckets when the range has that many steps.

    The source is the coarsest of ``MetricBucket.BUCKET_RESOLUTIONS`` that still
    cuts the range into ``points`` buckets (the raw points below the finest), so a
    long range never reads raw points. Its buckets are then merged, in the same
    query, ``m`` at a time for the largest ``m`` that still gives ``points``: the
    answer holds between ``points`` and ``2 * points`` buckets per series, not up
    to ``BUCKET_FANOUT`` times as many. A range of fewer than ``2 * points`` steps
    comes as raw points (resolution 1). Buckets are whole: the first and last may
    reach up to one bucket outside the range; each says which steps its points
    are at.

    A missing bound is the series' first or last step, found from the coarsest
    buckets (a few rows per series); with both bounds and the names given, the
    chart is one query.
    """
    names = list(dict.fromkeys(names))
    if not names or from_step is None or to_step is None:
        extents = list(
            MetricBucket.objects.filter(run=run, resolution=MetricBucket.BUCKET_RESOLUTIONS[-1])
            .filter(**({"name__in": names} if names else {}))
            .values("name")
            .annotate(first=Min("first_step"), last=Max("last_step"))
            .order_by("name")
        )
        names = names or [extent["name"] for extent in extents]
        if from_step is None and extents:
            from_step = min(extent["first"] for extent in extents)
        if to_step is None and extents:
            to_step = max(extent["last"] for extent in extents)
    series = {name: MetricSeries([], [], [], [], [], []) for name in names}
    if from_step is None or to_step is None or to_step < from_step or not names:
        return MetricChart(from_step=from_step, to_step=to_step, resolution=1, series=series)

    source_resolution, width = _chart_widths(steps=to_step - from_step + 1, points=points)
    first_group = from_step // width * width
    if width == 1:
        rows = (
            MetricPoint.objects.filter(
                run=run, name__in=names, step__gte=from_step, step__lte=to_step
            )
            .order_by("step")  # an integer sort; ordering by name too would sort by collation
            .values_list("name", "step", "value")
        )
        for name, step, value in rows:
            _append(series[name], step, step, 1, value, value, value)
        return MetricChart(from_step=from_step, to_step=to_step, resolution=1, series=series)
    if source_resolution == 1:
        rows = _merged(
            MetricPoint.objects.filter(
                run=run,
                name__in=names,
                step__gte=first_group,
                step__lte=to_step // width * width + width - 1,  # whole, like stored buckets
            ),
            key="step",
            width=width,
            aggregates=(
                Min("step"), Max("step"), Count("*"), Min("value"), Max("value"), Sum("value")
            ),
        )
    else:
        rows = _merged(
            MetricBucket.objects.filter(
                run=run,
                resolution=source_resolution,
                name__in=names,
                bucket_start__gte=first_group,
                bucket_start__lte=to_step,
            ),
            key="bucket_start",
            width=width,
            aggregates=(
                Min("first_step"), Max("last_step"), Sum("point_count"),
                Min("value_min"), Max("value_max"), Sum("value_sum"),
            ),
        )
    for name, first, last, count, low, high, total in rows:
        _append(series[name], first, last, count, low, high, total / count)
    return MetricChart(from_step=from_step, to_step=to_step, resolution=width, series=series)


@dataclass(frozen=True)
class RunsChart:
    """Series of several runs on one grid: a bucket of ``resolution`` steps sits at ``x``, the middle of the
    steps it covers, the same ``x`` in every run, so that runs overlay without resampling."""

    from_step: int | None
    to_step: int | None
    resolution: int
    # {run id: {name: {"x": [...], "mean": [...], "min": [...], "max": [...], "count": [...]}}}; a run
    # without a point of a name has no entry for it.
    series: dict[int, dict[str, dict[str, list[float]]]]


def metric_chart_runs(
    *,
    run_ids: Sequence[int],
    names: Sequence[str],
    points: int,
    from_step: int | None = None,
    to_step: int | None = None,
) -> RunsChart:
    """The series ``names`` of every run of ``run_ids`` over one step range, bucketed as :func:`metric_chart`
    buckets one run's, at the resolution the longest of them needs: one query for the range, one for the
    buckets, whatever the number of runs (the workspace draws hundreds)."""
    run_ids, names = list(dict.fromkeys(run_ids)), list(dict.fromkeys(names))
    series: dict[int, dict[str, dict[str, list[float]]]] = {run_id: {} for run_id in run_ids}
    if not run_ids or not names:
        return RunsChart(from_step=from_step, to_step=to_step, resolution=1, series=series)
    if from_step is None or to_step is None:
        extent = MetricBucket.objects.filter(
            run_id__in=run_ids, name__in=names, resolution=MetricBucket.BUCKET_RESOLUTIONS[-1]
        ).aggregate(first=Min("first_step"), last=Max("last_step"))
        from_step = extent["first"] if from_step is None else from_step
        to_step = extent["last"] if to_step is None else to_step
    if from_step is None or to_step is None or to_step < from_step:
        return RunsChart(from_step=from_step, to_step=to_step, resolution=1, series=series)

    source_resolution, width = _chart_widths(steps=to_step - from_step + 1, points=points)
    first_group = from_step // width * width
    if width == 1:
        rows = (
            MetricPoint.objects.filter(run_id__in=run_ids, name__in=names, step__gte=from_step, step__lte=to_step)
            .order_by("step")
            .values_list("run_id", "name", "step", "value")
        )
    elif source_resolution == 1:
        rows = _merged(
            MetricPoint.objects.filter(
                run_id__in=run_ids, name__in=names, step__gte=first_group,
                step__lte=to_step // width * width + width - 1,
            ),
            key="step", width=width, by=("run_id", "name"),
            aggregates=(Min("value"), Max("value"), Sum("value"), Count("*")),
            columns=("low", "high", "total", "count"), group_first=True,
        )
    else:
        rows = _merged(
            MetricBucket.objects.filter(
                run_id__in=run_ids, resolution=source_resolution, name__in=names,
                bucket_start__gte=first_group, bucket_start__lte=to_step,
            ),
            key="bucket_start", width=width, by=("run_id", "name"),
            aggregates=(Min("value_min"), Max("value_max"), Sum("value_sum"), Sum("point_count")),
            columns=("low", "high", "total", "count"), group_first=True,
        )
    middle = (width - 1) / 2
    for row in rows:
        if width == 1:
            run_id, name, step, mean = row
            low = high = mean
            count = 1
        else:
            run_id, name, step, low, high, total, count = row
            mean = total / count
        columns = series[run_id].setdefault(name, {"x": [], "mean": [], "min": [], "max": [], "count": []})
        columns["x"].append(step + middle)
        columns["mean"].append(mean)
        columns["min"].append(low)
        columns["max"].append(high)
        columns["count"].append(count)
    return RunsChart(from_step=from_step, to_step=to_step, resolution=width, series=series)


def _chart_widths(*, steps: int, points: int) -> tuple[int, int]:
    """(stored resolution to read, steps per bucket answered) for ``points`` over ``steps``.

    The stored resolution is the coarsest (1: raw) that cuts ``steps`` into at
    least ``points`` buckets; the answer's width is the largest multiple of it
    that still does (and is no wider than the range).
    """
    def enough(width: int) -> bool:
        return -(-steps // width) >= points

    resolution = 1
    for candidate in MetricBucket.BUCKET_RESOLUTIONS:
        if not enough(candidate):
            break
        resolution = candidate
    multiple = 1
    while resolution * (multiple + 1) <= steps and enough(resolution * (multiple + 1)):
        multiple += 1
    return resolution, resolution * multiple


def _merged(rows: QuerySet, *, key: str, width: int, aggregates: tuple, by: tuple[str, ...] = ("name",),
            columns: tuple[str, ...] = ("first", "last", "count", "low", "high", "total"),
            group_first: bool = False) -> QuerySet:
    """``rows`` grouped per series (``by``) into ``width``-step buckets, as chart rows ordered by step:
    ``by``'s values, then the bucket's first step when ``group_first``, then ``columns``."""
    # Floored, like the stored buckets (SQL's MOD truncates toward zero).
    group = ExpressionWrapper(
        F(key) - Mod(Mod(F(key), width) + width, width), output_field=IntegerField()
    )
    return (
        rows.annotate(group=group)
        .values(*by, "group")
        .annotate(**dict(zip(columns, aggregates, strict=True)))
        .order_by("group")
        .values_list(*by, *(("group",) if group_first else ()), *columns)
    )


def _append(series: MetricSeries, first, last, count, low, high, mean) -> None:
    series.first_step.append(first)
    series.last_step.append(last)
    series.count.append(count)
    series.min.append(low)
    series.max.append(high)
    series.mean.append(mean)


#: Episodes one timeline answer carries at most: older steps are left out past it, so that a run of
#: thousands of episodes per step still answers in a few megabytes the browser can draw.
MAX_TIMELINE_EPISODES = 20_000


@dataclass(frozen=True)
class TimelineWindow:
    steps: list[StepTimelineRecord]
    newest_step: int | None  # the run's newest stored step, whatever ``after_step`` was
    truncated: bool  # fewer steps than asked for, to stay within MAX_TIMELINE_EPISODES


def step_timeline_recent(
    *, run: Run, last: int, after_step: int | None = None, max_episodes: int = MAX_TIMELINE_EPISODES
) -> TimelineWindow:
    """The run's newest ``last`` stored steps (after ``after_step``, if given), oldest first.

    Each carries its stages and the episodes it consumed: everything a Gantt of
    those steps draws. The newest step always comes; older ones only while the
    window's episodes stay within ``max_episodes``. Two queries: the episode
    counts, then the chosen rows.
    """
    rows = StepTimelineRecord.objects.filter(run=run)
    counts = list(rows.order_by("-step").values_list("step", "episode_count")[:last])
    newest_step = counts[0][0] if counts else None
    chosen, episodes = [], 0
    for step, count in counts:
        if after_step is not None and step <= after_step:
            break
        if chosen and episodes + count > max_episodes:
            break
        chosen.append(step)
        episodes += count
    truncated = len(chosen) < len(counts) and (after_step is None or counts[len(chosen)][0] > after_step)
    if not chosen:
        return TimelineWindow(steps=[], newest_step=newest_step, truncated=truncated)
    window = list(rows.filter(step__gte=chosen[-1], step__lte=chosen[0]).order_by("step"))
    return TimelineWindow(steps=window, newest_step=newest_step, truncated=truncated)


def trace_list(*, run: Run) -> QuerySet[Trace]:
    """The run's trace requests and traces, newest first."""
    return Trace.objects.filter(run=run).order_by("-requested_at", "-id")


def trace_get(*, run: Run, trace_id: int) -> Trace:
    trace = Trace.objects.filter(run=run, pk=trace_id).first()
    if trace is None:
        raise NotFound(f"Trace {trace_id} of run {run.pk} not found.")
    return trace


def trace_requests_pending(*, run: Run) -> list[TraceRequest]:
    """What the trainer of ``run`` should trace next, oldest request first."""
    pending = Trace.objects.filter(run=run, status=Trace.Status.REQUESTED).order_by("requested_at", "id")
    return [TraceRequest(id=trace.pk, steps=trace.steps) for trace in pending]


def device_snapshot_get(*, run: Run) -> DeviceSnapshot:
    snapshot = DeviceSnapshot.objects.filter(run=run).first()
    if snapshot is None:
        raise NotFound(f"Run {run.pk} has no device report yet.")
    return snapshot


def run_list_trainer_held(*, user: AbstractBaseUser) -> QuerySet[Run]:
    """The runs of the user's projects that a trainer holds now, each with its newest device report.

    ``run.device_snapshot`` is there once the trainer has sent a report; reading
    it costs no query (it comes in the same rows). Oldest run first, so rows keep
    their places on a page that refreshes.
    """
    return (
        run_list(user=user)
        .filter(status__in=TRAINER_HELD_RUN_STATUSES)
        .select_related("device_snapshot")
        .order_by("created_at", "id")
    )


def producer_reports_by_run(*, run_ids: Sequence[int]) -> dict[int, list[ProducerReport]] | None:
    """Each run's producer processes as they last reported themselves in Redis; None if Redis is unreachable.

    A process writes its report at the start and end of every rollout task, so
    one that died stays listed with its last report: ``reported_at`` tells.
    """
    if not run_ids:
        return {}
    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2)
        try:
            pipeline = client.pipeline(transaction=False)
            for run_id in run_ids:
                pipeline.hgetall(producers_key(run_id))
            hashes = pipeline.execute()
        finally:
            client.close()
    except redis.RedisError as exc:
        logger.warning("producer reports not read: %s", exc)
        return None
    reports: dict[int, list[ProducerReport]] = {}
    for run_id, raw_reports in zip(run_ids, hashes, strict=True):
        readable = []
        for raw in raw_reports.values():
            try:
                readable.append(ProducerReport.model_validate_json(raw))
            except (pydantic.ValidationError, SchemaVersionError):
                continue  # a newer writer's shape: the trainer logs these; the page leaves them out
        reports[run_id] = sorted(readable, key=lambda report: report.worker)
    return reports


@dataclass(frozen=True)
class ProcessListing:
    """Every live Tandem process, and which of the runs they work on the user may see."""

    reports: list[ProcessReport]
    visible_run_ids: frozenset[int]


def process_listing(*, user: AbstractBaseUser) -> ProcessListing | None:
    """Every live Tandem process (web, platform worker, rollout workers, trainers); None if Redis is unreachable.

    Processes are shared infrastructure, so every user sees all of them; of the
    runs they work on, only those of the user's projects are named. Reading
    prunes the reports of dead processes (``tandem.runtime.process_reports``).
    """
    reports = live_process_reports_at(settings.REDIS_URL)
    if reports is None:
        return None
    run_ids = {run_id for report in reports for run_id in report.run_ids}
    visible = run_list(user=user).filter(pk__in=run_ids).values_list("pk", flat=True) if run_ids else []
    return ProcessListing(reports=reports, visible_run_ids=frozenset(visible))


@dataclass(frozen=True)
class MetricSummary:
    """A series of a run at its newest step and at its best (the highest, or the lowest where lower is better)."""

    name: str
    final: float
    final_step: int
    best: float
    best_step: int
    lower_is_better: bool


def metric_summaries(*, run: Run, names: Sequence[str], lower_is_better: Collection[str] = ()
                     ) -> list[MetricSummary]:
    """The summaries of those of ``names`` the run has, in that order: two indexed reads a series (its
    newest point, its best), whatever its length (a non-finite value is never stored: metric_events_record)."""
    summaries = []
    for name in names:
        series = MetricPoint.objects.filter(run=run, name=name)
        final = series.order_by("-step").values_list("step", "value").first()
        if final is None:
            continue
        lower = name in lower_is_better
        best_step, best_value = series.order_by("value" if lower else "-value", "step").values_list(
            "step", "value").first()
        summaries.append(MetricSummary(name=name, final=final[1], final_step=final[0], best=best_value,
                                       best_step=best_step, lower_is_better=lower))
    return summaries


def metric_totals(*, run: Run, prefix: str) -> dict[str, tuple[float, int]]:
    """Per series whose name starts with ``prefix``: the sum of its values over the run, and its steps."""
    totals = (MetricPoint.objects.filter(run=run, name__startswith=prefix).values("name")
              .annotate(total=Sum("value"), steps=Count("id")).order_by("name"))
    return {row["name"]: (row["total"] or 0.0, row["steps"]) for row in totals}


# Each cause's words in the idle sentence, after "x%" ({environment}: where it names the environment).
_IDLE_CAUSE_WORDS = {"generation": "on {environment}generation", "environment": "on {environment}environment steps",
                     "tool": "on {environment}tool calls", "capacity": "on {environment}producers at capacity",
                     "queue": "in {environment}queue"}
if set(_IDLE_CAUSE_WORDS) != set(IDLE_CAUSES):
    raise AssertionError("every idle cause needs its words in the idle sentence")


@dataclass(frozen=True)
class IdleShare:
    environment: str
    cause: str
    fraction: float  # of the steps' wall time


@dataclass(frozen=True)
class IdleSummary:
    """What the trainer waited on over its last ``steps`` steps (``trainer/idle_attribution.py``)."""

    steps: int
    idle_fraction: float
    shares: list[IdleShare]  # largest first

    @property
    def sentence(self) -> str:
        """"trainer idle 31% over the last 50 steps: 24% waiting on `shout` environment steps, 5% on
        generation, 2% in queue"; shares under half a percent are left out, and the environment is named
        where it matters (its steps and tools, or when there are several)."""
        head = f"trainer idle {self.idle_fraction:.0%} over the last {self.steps} step{'s' if self.steps != 1 else ''}"
        several = len({share.environment for share in self.shares}) > 1
        parts = []
        for share in self.shares:
            if share.fraction < 0.005:
                continue
            named = share.cause in ("environment", "tool") or several
            what = _IDLE_CAUSE_WORDS[share.cause].format(environment=f"`{share.environment}` " if named else "")
            parts.append(f"{share.fraction:.0%} {'waiting ' if not parts else ''}{what}")
        return head + (": " + ", ".join(parts) if parts else "")


def idle_summary(*, run: Run, last_steps: int = 50) -> IdleSummary | None:
    """The run's trainer idle share over its newest ``last_steps`` steps and what it waited on; None
    before its first step."""
    steps = list(MetricPoint.objects.filter(run=run, name="wall_s").order_by("-step")
                 .values_list("step", flat=True)[:last_steps])
    if not steps:
        return None
    totals = dict(MetricPoint.objects.filter(run=run, step__gte=min(steps), step__lte=max(steps))
                  .filter(name__in=("wall_s", "wait_s")).values("name").annotate(total=Sum("value"))
                  .values_list("name", "total"))
    wall = totals.get("wall_s") or 0.0
    if wall <= 0:
        return None
    idle = (MetricPoint.objects.filter(run=run, step__gte=min(steps), step__lte=max(steps),
                                       name__startswith="idle/")
            .values("name").annotate(total=Sum("value")).values_list("name", "total"))
    shares = []
    for name, total in idle:
        environment, _, cause = name.removeprefix("idle/").rpartition("/")
        cause = cause.removesuffix("_s")
        if environment and cause in _IDLE_CAUSE_WORDS:
            shares.append(IdleShare(environment=environment, cause=cause, fraction=(total or 0.0) / wall))
    shares.sort(key=lambda share: (-share.fraction, share.environment, share.cause))
    return IdleSummary(steps=len(steps), idle_fraction=(totals.get("wait_s") or 0.0) / wall, shares=shares)


def metric_names(*, run: Run) -> list[str]:
    """Every series the run has logged, by name: one row per series, read from its coarsest buckets."""
    return list(
        MetricBucket.objects.filter(run=run, resolution=MetricBucket.BUCKET_RESOLUTIONS[-1])
        .order_by("name").values_list("name", flat=True).distinct()
    )


def metric_names_matching(*, run: Run, patterns: Sequence[str]) -> list[str]:
    """The run's series named by ``patterns``: exact names or globs (``rollout/*/latency_p90_s``; ``*``
    crosses ``/``), by name."""
    return [name for name in metric_names(run=run) if any(fnmatchcase(name, pattern) for pattern in patterns)]


# The series the x-axes other than the trainer step are summed from (TrainerStepEvent.metric_values()).
_STEP_WALL_SERIES = "wall_s"
_SAMPLES_RATE_SERIES = SAMPLES_PER_S_METRIC


@dataclass(frozen=True)
class MetricTable:
    """Series side by side, one row per step where any of them has a point, with every x-axis a chart offers.

    ``rl_step`` is the step counted from the end of the SFT phase (the trainer numbers SFT steps 1 to
    ``sft_steps``, so RL starts at 1 and SFT steps are 0 or less): runs with and without SFT line up at
    its 0. ``wall_time_s`` sums the steps' ``wall_s`` up to and including each step; ``samples_trained``
    sums ``samples_per_s * wall_s`` (the trajectories each step trained on). A value is None where its
    series has no point at that step.
    """

    sft_steps: int
    names: list[str]
    steps: list[int]
    rl_step: list[int]
    wall_time_s: list[float]
    samples_trained: list[float]
    values: dict[str, list[float | None]]


def metric_table(*, run: Run, names: Sequence[str]) -> MetricTable:
    """The series ``names`` of ``run`` with their x-axes (one query)."""
    names = list(dict.fromkeys(names))
    sft_steps = int(run.config.get("sft_steps") or 0)
    rows = (MetricPoint.objects.filter(run=run, name__in={*names, _STEP_WALL_SERIES, _SAMPLES_RATE_SERIES})
            .order_by("step").values_list("step", "name", "value"))
    by_step: dict[int, dict[str, float]] = {}
    for step, name, value in rows:
        by_step.setdefault(step, {})[name] = value
    wanted = set(names)
    table = MetricTable(sft_steps=sft_steps, names=names, steps=[], rl_step=[], wall_time_s=[],
                        samples_trained=[], values={name: [] for name in names})
    wall_time = samples = 0.0
    for step, values in by_step.items():  # by step: the rows came ordered
        wall = values.get(_STEP_WALL_SERIES, 0.0)
        wall_time += wall
        samples += values.get(_SAMPLES_RATE_SERIES, 0.0) * wall
        if wanted.isdisjoint(values):
            continue
        table.steps.append(step)
        table.rl_step.append(step - sft_steps)
        table.wall_time_s.append(wall_time)
        table.samples_trained.append(samples)
        for name in names:
            table.values[name].append(values.get(name))
    return table
