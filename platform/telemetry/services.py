"""Writes of telemetry: the trainer's step events, the chart buckets that summarise them, the
timeline's recent steps, and traces."""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.files.uploadedfile import UploadedFile
from django.db import connection, transaction
from django.utils import timezone

from accounts.permissions import project_require_writer
from alerts.services import alerts_step_events_recorded
from common.domain_errors import Conflict, InvalidInput
from common.stored_text import json_text_escape
from runs.models import Run
from runs.realtime import project_broadcast_on_commit, run_broadcast, run_broadcast_on_commit
from runs.services import run_progress_record
from tandem.contracts import SERIES_REFUSED_METRIC, RefusedSeries, StepEpisodes, TrainerStepEvent

from .models import DeviceSnapshot, MetricBucket, MetricPoint, StepTimelineRecord, Trace

logger = logging.getLogger(__name__)

# A trace of many steps is large (every kernel of every step) and slows those steps.
MAX_TRACE_STEPS = 100
# A run in these will never train again: it has no next steps to trace.
TRACE_REFUSED_STATUSES = frozenset({Run.Status.FINISHED, Run.Status.CANCELLED})


@transaction.atomic
def metric_events_record(*, run: Run, events: Sequence[TrainerStepEvent],
                         episode_chunks: Sequence[StepEpisodes] = ()) -> int:
    """Store the events' metric values and tell the run's open pages about them.

    Storing is idempotent: a retried post of the same events stores nothing new
    and returns the same count. The run's progress moves forward only while it
    runs; events arriving after a cancel are kept but do not revive it.
    Returns the number of metric points the events carry.

    JSON has no NaN or infinity, so a non-finite value (a diverged loss) is
    neither stored nor sent: the chart shows a gap at that step. A series whose name cannot be
    stored (:func:`metric_series_refusals`) is left out alone, and counted at its step in
    ``telemetry/series_refused``.

    ``episode_chunks`` carry the rest of the episodes of steps too large for one post
    (:func:`step_episodes_place`), in the same transaction as the events.
    """
    for index, event in enumerate(events):
        if event.run_id != run.pk:
            raise InvalidInput.for_field(
                f"events.{index}.run_id",
                f"Event is for run {event.run_id}, posted to run {run.pk}.",
            )
    if not events:
        step_episodes_place(run=run, chunks=episode_chunks)
        return 0

    # Locked before the points are written, so that two posts for the run take
    # turns: each one's bucket recompute then sees every point committed before it.
    run = Run.objects.select_for_update().get(pk=run.pk)
    refused = metric_series_refusals(events)
    if refused:
        logger.warning("run %s: %d series of its telemetry refused, first %s at step %d: %s", run.pk, len(refused),
                       refused[0].name, refused[0].step, refused[0].reason)
    now = timezone.now()
    values_by_event = [
        (event, _finite_values(event)) for event in sorted(events, key=lambda e: e.step)
    ]
    points = [
        MetricPoint(run=run, step=event.step, name=name, value=value, recorded_at=now)
        for event, values in values_by_event
        for name, value in values.items()
    ]
    # A trainer resumed from a checkpoint trains the steps after it again: the
    # newest value of a step is the one its surviving parameters went through.
    _points_store(run_id=run.pk, points=points)

    with_devices = [event for event in events if event.device is not None]
    if with_devices:
        # Newest by the trainer's clock, not by step: a resumed trainer trains earlier steps again.
        newest = max(with_devices, key=lambda event: event.device.reported_at)
        # Through pydantic's JSON, as the timeline below: it writes a non-finite float as null, jsonb has no NaN.
        _device_snapshot_store(run=run, step=newest.step, report=json.loads(newest.device.model_dump_json()),
                               now=now)

    step_timelines_store(run=run, events=events, now=now)
    # After the steps they belong to, which may be in this very post.
    step_episodes_place(run=run, chunks=episode_chunks)

    run = run_progress_record(run=run, trainer_step=max(event.step for event in events),
                              policy_version=max(event.policy_version for event in events), at=now)
    run_id = run.pk
    # Judged once this commits: the run's open pages learn of an alert as it starts or stops holding.
    alerts_step_events_recorded(run=run, events=events, on_change=lambda changes: run_broadcast(
        run_id, [{"type": "alert", "run": run_id, **change} for change in changes]))

    messages = [
        {
            "type": "metrics",
            "run": run.pk,
            "step": event.step,
            "phase": event.phase,
            "values": values,
            "status": run.status,
            "policy_version": event.policy_version,
        }
        for event, values in values_by_event
    ]
    run_broadcast_on_commit(run.pk, messages)
    # The project's workspace and reports overlay every run: they hear each step too.
    project_broadcast_on_commit(run.project_id, messages)
    return len(points)


@transaction.atomic
def metric_points_record(*, run: Run, step: int, values: Mapping[str, float]) -> int:
    """Store ``values`` as the run's points at ``step``, for series that are no trainer step's telemetry.

    An evaluation's metrics, say: charted and read like the step events' series, but
    they move neither the run's progress nor its open pages. A value stored again
    at its step replaces the old one, so a retried post adds nothing; a non-finite
    one is not stored. Returns the number of points stored.
    """
    # Locked first, as metric_events_record does, so that the bucket recomputes take turns.
    run = Run.objects.select_for_update().get(pk=run.pk)
    now = timezone.now()
    points = [
        MetricPoint(run=run, step=step, name=name, value=value, recorded_at=now)
        for name, value in values.items() if math.isfinite(value)
    ]
    _points_store(run_id=run.pk, points=points)
    return len(points)


def _points_store(*, run_id: int, points: Sequence[MetricPoint]) -> None:
    """Upsert the points on (run, name, step), then recompute the chart buckets holding them."""
    if not points:
        return
    MetricPoint.objects.bulk_create(
        points, update_conflicts=True, unique_fields=["run", "name", "step"],
        update_fields=["value", "recorded_at"], batch_size=1000,
    )
    _buckets_recompute(
        run_id=run_id,
        names=sorted({point.name for point in points}),
        steps={point.step for point in points},
    )


@transaction.atomic
def step_timelines_store(*, run: Run, events: Sequence[TrainerStepEvent], now=None) -> int:
    """Keep the events' stage timelines and episodes for the timeline page; returns the steps stored.

    A step stored again (a retried post, a resumed trainer training it anew)
    replaces its row. Then only the run's newest ``TANDEM_TIMELINE_STEPS_KEPT``
    steps are kept, so that a long run's detail does not grow without bound.
    Events without a timeline (older trainers) leave nothing to draw.
    """
    now = now or timezone.now()
    newest_by_step = {}
    for event in events:
        spans = event.timeline.spans if event.timeline is not None else []
        if spans and math.isfinite(spans[0].started_at) and math.isfinite(spans[-1].ended_at):
            newest_by_step[event.step] = event  # a post's later copy of a step wins, as for points
    rows = []
    for event in newest_by_step.values():
        # Through pydantic's JSON, which writes a non-finite float (a NaN reward) as null:
        # jsonb has no NaN.
        detail = json.loads(event.model_dump_json(include={"timeline", "episodes"}))
        rows.append(StepTimelineRecord(
            run=run,
            step=event.step,
            phase=event.phase,
            policy_version=event.policy_version,
            started_at=event.timeline.spans[0].started_at,
            ended_at=event.timeline.spans[-1].ended_at,
            stages=detail["timeline"]["spans"],
            # An environment's error text may hold NUL, which jsonb cannot: escaped, read back exactly.
            episodes=json_text_escape(detail["episodes"]),
            # A step cut into chunks counts all its episodes; the chunks fill in the rest.
            episode_count=event.episodes_total if event.episodes_total is not None else len(detail["episodes"]),
            recorded_at=now,
        ))
    if not rows:
        return 0
    StepTimelineRecord.objects.bulk_create(
        rows, update_conflicts=True, unique_fields=["run", "step"],
        update_fields=["phase", "policy_version", "started_at", "ended_at", "episode_count", "stages",
                       "episodes", "recorded_at"],
        batch_size=200,
    )
    # A resumed trainer trains again from its checkpoint's step: the steps a dead attempt had
    # trained beyond it are numbered after these posts but began before them. They are history
    # that no longer exists; left in place they would hold the page's "newest steps" window.
    StepTimelineRecord.objects.filter(
        run=run, step__gt=max(row.step for row in rows), started_at__lt=min(row.started_at for row in rows),
    ).delete()
    kept = max(settings.TANDEM_TIMELINE_STEPS_KEPT, 1)
    # Two indexed statements per post, whatever the run's length: the kept boundary, the delete.
    oldest_kept = list(
        StepTimelineRecord.objects.filter(run=run).order_by("-step")
        .values_list("step", flat=True)[kept - 1:kept]
    )
    if oldest_kept:
        StepTimelineRecord.objects.filter(run=run, step__lt=oldest_kept[0]).delete()
    return len(rows)


@transaction.atomic
def step_episodes_place(*, run: Run, chunks: Sequence[StepEpisodes]) -> int:
    """Place chunks of steps' episodes into the steps' timelines; returns the episodes placed.

    A chunk lands at its offset, so a chunk posted again replaces itself. It follows its
    step's event (in the same post or an earlier one). A chunk of a step the run does not
    keep (pruned past TANDEM_TIMELINE_STEPS_KEPT, or with no timeline to draw) is not
    placed, as its event's episodes were not; one that would leave a gap in, or overrun,
    a kept step is refused, naming it.
    """
    placed = 0
    for index, chunk in enumerate(chunks):
        field = f"episode_chunks.{index}"
        if chunk.run_id != run.pk:
            raise InvalidInput.for_field(f"{field}.run_id", f"Chunk is for run {chunk.run_id}, posted to run {run.pk}.")
        record = StepTimelineRecord.objects.select_for_update().filter(run=run, step=chunk.step).first()
        if record is None:
            continue
        end = chunk.offset + len(chunk.episodes)
        if chunk.offset > len(record.episodes) or end > record.episode_count:
            raise InvalidInput.for_field(f"{field}.offset", (
                f"Step {chunk.step} holds {len(record.episodes)} of its {record.episode_count} episodes; "
                f"a chunk of {len(chunk.episodes)} at {chunk.offset} leaves a gap or overruns it."))
        spans = json_text_escape(json.loads(chunk.model_dump_json(include={"episodes"}))["episodes"])
        record.episodes[chunk.offset:end] = spans
        record.save(update_fields=["episodes"])
        placed += len(spans)
    return placed


@transaction.atomic
def metric_buckets_rebuild(*, run: Run) -> int:
    """Recompute every chart bucket of the run from its points; returns the buckets written.

    The bulk path for points written without ``metric_events_record`` (an import,
    the benchmark's COPY): the same statements as the write path, over every step.
    """
    Run.objects.select_for_update().get(pk=run.pk)
    return _buckets_recompute(run_id=run.pk, names=None, steps=None)


def _buckets_recompute(
    *, run_id: int, names: Sequence[str] | None, steps: set[int] | None
) -> int:
    """Recompute the buckets holding ``steps`` of the series ``names`` (None: all), every level.

    A recompute rather than an increment, because a re-sent step replaces a value
    and an old minimum or maximum cannot be taken back out of a bucket. Each level
    reads only the at most ``BUCKET_FANOUT`` rows per bucket of the level below it
    (the finest reads the points), so a post costs one statement per level
    whatever the length of the run.
    """
    written = 0
    source_resolution = None  # the raw points
    for resolution in MetricBucket.BUCKET_RESOLUTIONS:
        ranges = None if steps is None else _bucket_ranges(steps, resolution)
        sql, params = _bucket_upsert_sql(
            run_id=run_id,
            resolution=resolution,
            source_resolution=source_resolution,
            names=names,
            ranges=ranges,
        )
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            written += cursor.rowcount
        source_resolution = resolution
    return written


def _bucket_ranges(steps: set[int], resolution: int) -> list[tuple[int, int]]:
    """The steps' buckets at ``resolution`` as few inclusive step ranges (adjacent ones merged)."""
    ranges: list[tuple[int, int]] = []
    for start in sorted({step // resolution * resolution for step in steps}):
        if ranges and ranges[-1][1] + 1 == start:
            ranges[-1] = (ranges[-1][0], start + resolution - 1)
        else:
            ranges.append((start, start + resolution - 1))
    return ranges


_BUCKET_TABLE = MetricBucket._meta.db_table
_POINT_TABLE = MetricPoint._meta.db_table
_BUCKET_FIELDS = (
    "point_count", "value_sum", "value_min", "value_max", "first_step", "last_step"
)


def _floor_to_multiple(column: str, resolution: int) -> str:
    # SQL's % truncates toward zero; this floors, so step -1 is in the bucket at -4, not 0.
    # (%% is the driver's escape of %, on PostgreSQL and SQLite alike.)
    return f"({column} - ((({column} %% {resolution}) + {resolution}) %% {resolution}))"


def _bucket_upsert_sql(
    *,
    run_id: int,
    resolution: int,
    source_resolution: int | None,
    names: Sequence[str] | None,
    ranges: list[tuple[int, int]] | None,
) -> tuple[str, list]:
    """``INSERT ... SELECT ... GROUP BY ... ON CONFLICT DO UPDATE``, for PostgreSQL and SQLite.

    Resolutions are our own integer constants, so they are written into the SQL:
    the GROUP BY expression must be the very one the SELECT list uses.
    """
    resolution, params = int(resolution), [run_id]
    if source_resolution is None:
        key = "step"
        start = _floor_to_multiple(key, resolution)
        aggregates = "COUNT(*), SUM(value), MIN(value), MAX(value), MIN(step), MAX(step)"
        where = f"FROM {_POINT_TABLE} WHERE run_id = %s"
    else:
        key = "bucket_start"
        start = _floor_to_multiple(key, resolution)
        aggregates = (
            "SUM(point_count), SUM(value_sum), MIN(value_min), MAX(value_max), "
            "MIN(first_step), MAX(last_step)"
        )
        where = (
            f"FROM {_BUCKET_TABLE} WHERE run_id = %s AND resolution = {int(source_resolution)}"
        )
    if names is not None:
        where += f" AND name IN ({', '.join(['%s'] * len(names))})"
        params.extend(names)
    if ranges is not None:
        where += " AND (" + " OR ".join([f"{key} BETWEEN %s AND %s"] * len(ranges)) + ")"
        params.extend(bound for step_range in ranges for bound in step_range)
    # The WHERE also keeps SQLite from reading ON CONFLICT as a join's ON clause.
    sql = (
        f"INSERT INTO {_BUCKET_TABLE} (run_id, name, resolution, bucket_start, "
        f"{', '.join(_BUCKET_FIELDS)}) "
        f"SELECT run_id, name, {resolution}, {start}, {aggregates} {where} "
        f"GROUP BY run_id, name, {start} "
        "ON CONFLICT (run_id, resolution, name, bucket_start) DO UPDATE SET "
        + ", ".join(f"{field} = EXCLUDED.{field}" for field in _BUCKET_FIELDS)
    )
    return sql, params


def _device_snapshot_store(*, run: Run, step: int, report: dict, now) -> None:
    snapshot = DeviceSnapshot.objects.select_for_update().filter(run=run).first()
    if snapshot is None:
        DeviceSnapshot.objects.create(run=run, step=step, report=report, recorded_at=now)
    elif snapshot.report.get("reported_at", 0.0) <= report["reported_at"]:
        snapshot.step, snapshot.report, snapshot.recorded_at = step, report, now
        snapshot.save(update_fields=["step", "report", "recorded_at"])


def _series_refusal(name: str) -> str:
    """Why the platform cannot store a series of this name; "" if it can."""
    max_length = MetricPoint._meta.get_field("name").max_length
    if len(name) > max_length:
        return f"longer than {max_length} characters"
    if "\x00" in name:
        return "holds a NUL character, which PostgreSQL cannot store"
    return ""


def metric_series_refusals(events: Sequence[TrainerStepEvent]) -> list[RefusedSeries]:
    """The series of ``events`` that cannot be stored, each with why: they are left out alone, the
    rest of the post is stored (:func:`metric_events_record`)."""
    return [RefusedSeries(step=event.step, name=name[:200], reason=reason)
            for event in events for name in event.metric_values() if (reason := _series_refusal(name))]


def _finite_values(event: TrainerStepEvent) -> dict[str, float]:
    """The event's storable values; with as many series refused, SERIES_REFUSED_METRIC counts them."""
    values, refused = {}, 0
    for name, value in event.metric_values().items():
        if _series_refusal(name):
            refused += 1
        elif math.isfinite(value):
            values[name] = value
    if refused:
        values[SERIES_REFUSED_METRIC] = float(refused)
    return values


@transaction.atomic
def trace_request(*, user: AbstractBaseUser, run: Run, steps: int) -> Trace:
    """Ask the run's trainer for a jax.profiler trace of its next ``steps`` steps.

    The trainer learns of it in the reply to its next telemetry post. A run
    that will never train again (finished or cancelled) cannot be traced.
    """
    project_require_writer(user=user, project=run.project)
    if not 1 <= steps <= MAX_TRACE_STEPS:
        raise InvalidInput.for_field("steps", f"Must be between 1 and {MAX_TRACE_STEPS}.")
    if run.status in TRACE_REFUSED_STATUSES:
        raise Conflict(f"Run {run.pk} is {run.status}: it has no next steps to trace.")
    return Trace.objects.create(run=run, steps=steps, requested_by=user)


@transaction.atomic
def trace_upload(*, run: Run, trace_id: int, first_step: int, last_step: int,
                 file: UploadedFile | None, error: str = "") -> Trace:
    """Store the trainer's trace of a request (or, with no file, why it could not take one)."""
    trace = Trace.objects.select_for_update().filter(run=run, pk=trace_id).first()
    if trace is None:
        raise InvalidInput.for_field("trace", f"Run {run.pk} has no trace request {trace_id}.")
    if trace.status != Trace.Status.REQUESTED:
        raise Conflict(f"Trace {trace_id} of run {run.pk} is already {trace.status}.")
    if file is None and not error:
        raise InvalidInput.for_field("file", "Upload the zipped trace, or say in 'error' why there is none.")
    trace.first_step, trace.last_step = first_step, last_step
    trace.captured_at = timezone.now()
    if file is None:
        trace.status, trace.error = Trace.Status.FAILED, error
    else:
        trace.status, trace.size_bytes = Trace.Status.CAPTURED, file.size
        trace.file.save(f"trace-{trace.pk}.zip", file, save=False)
    trace.save()
    return trace
