from __future__ import annotations

from django.db import models
from django.utils import timezone

from tandem.contracts import TraceStatus


class MetricPoint(models.Model):
    """One value of one series (``loss``, ``reward_mean`` ...) at one trainer step."""

    # Not indexed on its own: both composite indexes below start with the run.
    run = models.ForeignKey(
        "runs.Run", on_delete=models.CASCADE, related_name="metric_points", db_index=False
    )
    step = models.IntegerField()
    name = models.CharField(max_length=64)
    value = models.FloatField()
    recorded_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # Makes a retried telemetry post idempotent, and is the (run, name, step)
            # index that per-series reads use.
            models.UniqueConstraint(fields=["run", "name", "step"], name="metric_point_unique"),
        ]
        indexes = [
            # The REST backfill reads every series of a run by step.
            models.Index(fields=["run", "step"], name="metric_point_run_step_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.name}@{self.step}={self.value}"


class MetricBucket(models.Model):
    """Summary of one series over ``resolution`` consecutive steps, for charts of long runs.

    Each level (``BUCKET_RESOLUTIONS``) is derived from the one below it, the finest
    from the raw points, and all of them change in the same transaction as the
    points they summarise (``telemetry.services``). A chart of a long range reads a
    few thousand of these instead of millions of points.
    """

    # Steps per bucket, each level ``BUCKET_FANOUT`` times the one below: a chart asking
    # for n points gets between n and 4n buckets, and a point is in 8 buckets.
    BUCKET_FANOUT = 4
    BUCKET_RESOLUTIONS = (4, 16, 64, 256, 1024, 4096, 16384, 65536)

    # The key is the read path's index and the upsert's conflict target; a surrogate
    # id would only add a second index to every bulk write. Resolution before name:
    # listing a run's series reads only its coarsest level's few rows.
    pk = models.CompositePrimaryKey("run_id", "resolution", "name", "bucket_start")
    run = models.ForeignKey(
        "runs.Run", on_delete=models.CASCADE, related_name="metric_buckets", db_index=False
    )
    name = models.CharField(max_length=64)
    resolution = models.IntegerField()
    bucket_start = models.IntegerField(help_text="First step covered: a multiple of resolution.")
    point_count = models.IntegerField()
    value_sum = models.FloatField()
    value_min = models.FloatField()
    value_max = models.FloatField()
    first_step = models.IntegerField(help_text="Step of the bucket's first point.")
    last_step = models.IntegerField(help_text="Step of the bucket's last point.")

    def __str__(self) -> str:
        return f"{self.name}[{self.bucket_start}+{self.resolution}]"


def _trace_path(trace: Trace, filename: str) -> str:
    return f"traces/run-{trace.run_id}/trace-{trace.pk}.zip"


class Trace(models.Model):
    """A user's request for a jax.profiler trace of a run's next steps, and the trace once uploaded."""

    class Status(models.TextChoices):
        REQUESTED = TraceStatus.REQUESTED.value, "Requested"
        CAPTURED = TraceStatus.CAPTURED.value, "Captured"
        FAILED = TraceStatus.FAILED.value, "Failed"

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="traces")
    steps = models.PositiveIntegerField()
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.REQUESTED)
    requested_by = models.ForeignKey(
        "auth.User", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    requested_at = models.DateTimeField(default=timezone.now)
    captured_at = models.DateTimeField(null=True, blank=True)
    first_step = models.IntegerField(null=True, blank=True)
    last_step = models.IntegerField(null=True, blank=True)
    # The zipped trace directory: xplane.pb and trace.json.gz, as jax.profiler wrote them.
    file = models.FileField(upload_to=_trace_path, blank=True)
    size_bytes = models.BigIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        indexes = [
            # The trainer asks for the pending requests of its run at every telemetry post.
            models.Index(fields=["run", "status"], name="trace_run_status_idx"),
        ]

    def __str__(self) -> str:
        return f"trace {self.pk} of run {self.run_id} ({self.status})"


class DeviceSnapshot(models.Model):
    """The newest DeviceReport of a run's trainer: what metric points cannot hold (the device kind)."""

    run = models.OneToOneField("runs.Run", on_delete=models.CASCADE, related_name="device_snapshot")
    step = models.IntegerField()
    report = models.JSONField()  # tandem.contracts.DeviceReport
    recorded_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"devices of run {self.run_id} at step {self.step}"


class StepTimelineRecord(models.Model):
    """One trainer step for the run's timeline: its stages and every episode it consumed.

    Kept for the newest ``TANDEM_TIMELINE_STEPS_KEPT`` steps of a run only
    (``telemetry.services``): the series in MetricPoint are the long record,
    these the detail of the recent past. Times are unix seconds as the trainer
    (stages) and the producers (episodes) read their clocks.
    """

    run = models.ForeignKey(
        "runs.Run", on_delete=models.CASCADE, related_name="step_timelines", db_index=False
    )
    step = models.IntegerField()
    phase = models.CharField(max_length=8)
    policy_version = models.IntegerField()
    started_at = models.FloatField(help_text="Unix seconds: the step's first stage began.")
    ended_at = models.FloatField(help_text="Unix seconds: its last stage ended.")
    # Kept beside the JSON so that a window can be sized by episodes without reading them.
    episode_count = models.IntegerField(default=0)
    # [{name, started_at, ended_at}]: tandem.contracts.StageSpan, contiguous and in order.
    stages = models.JSONField()
    # [tandem.contracts.EpisodeSpan]: every trajectory the step consumed.
    episodes = models.JSONField(default=list)
    recorded_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            # A retried post, or a resumed trainer's step trained again, replaces the row;
            # and the (run, step) index that the window and the trim read.
            models.UniqueConstraint(fields=["run", "step"], name="step_timeline_unique"),
        ]

    def __str__(self) -> str:
        return f"timeline of run {self.run_id} step {self.step}"
