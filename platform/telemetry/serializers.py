"""Shapes of telemetry's API: chart and timeline queries, trace requests in, traces out, the
trainer's uploads, and devices."""

from typing import get_args

from django.core.exceptions import ObjectDoesNotExist
from django.urls import reverse
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from tandem.contracts import (
    EPISODE_STATUSES,
    IDLE_CAUSES,
    EpisodeOutcome,
    EpisodeSpan,
    ProcessRole,
    StageSpan,
)

from .models import Trace
from .services import MAX_TRACE_STEPS

MAX_CHART_POINTS = 10_000
MAX_CHART_SERIES = 50
# Runs one comparison overlays (issue 18): more lines than this no longer read apart on one chart.
MAX_COMPARED_RUNS = 10
# A window's steps each carry every episode they consumed: a few hundred steps of large
# groups are already megabytes.
MAX_TIMELINE_STEPS = 200
DEFAULT_TIMELINE_STEPS = 60


class MetricChartQuerySerializer(serializers.Serializer):
    """``?names=a,b&points=1000&from_step=&to_step=`` of a chart query."""

    names = serializers.CharField(required=False, allow_blank=True, default="")
    points = serializers.IntegerField(min_value=1, max_value=MAX_CHART_POINTS, default=1000)
    from_step = serializers.IntegerField(required=False)
    to_step = serializers.IntegerField(required=False)

    def validate_names(self, value: str) -> list[str]:
        names = [name for name in value.split(",") if name]
        if len(names) > MAX_CHART_SERIES:
            raise serializers.ValidationError(f"At most {MAX_CHART_SERIES} series per chart.")
        if any(len(name) > 64 for name in names):
            raise serializers.ValidationError("A series name has at most 64 characters.")
        return names

    def validate(self, attrs: dict) -> dict:
        from_step, to_step = attrs.get("from_step"), attrs.get("to_step")
        if from_step is not None and to_step is not None and to_step < from_step:
            raise serializers.ValidationError({"to_step": ["Must not be less than from_step."]})
        return attrs


class MetricExportQuerySerializer(serializers.Serializer):
    """``?names=a,rollout/*/latency_p90_s&format=csv|json`` of a download: series names or globs."""

    names = serializers.CharField(help_text="Comma-separated series names or globs (`*` crosses `/`).")
    format = serializers.ChoiceField(choices=["csv", "json"], default="json")

    def validate_names(self, value: str) -> list[str]:
        patterns = [pattern.strip() for pattern in value.split(",") if pattern.strip()]
        if not patterns:
            raise serializers.ValidationError("Name at least one series.")
        if len(patterns) > MAX_CHART_SERIES:
            raise serializers.ValidationError(f"At most {MAX_CHART_SERIES} names or globs.")
        if any(len(pattern) > 200 for pattern in patterns):
            raise serializers.ValidationError("A name or glob has at most 200 characters.")
        return patterns


class MetricCompareExportQuerySerializer(MetricExportQuerySerializer):
    """A download of the same series of several runs: ``?runs=1,2,3`` besides the names."""

    runs = serializers.CharField(help_text=f"Comma-separated run ids, at most {MAX_COMPARED_RUNS}.")

    def validate_runs(self, value: str) -> list[int]:
        try:
            run_ids = list(dict.fromkeys(int(raw) for raw in value.split(",") if raw.strip()))
        except ValueError:
            raise serializers.ValidationError("Run ids are whole numbers.") from None
        if not 1 <= len(run_ids) <= MAX_COMPARED_RUNS:
            raise serializers.ValidationError(f"Name 1 to {MAX_COMPARED_RUNS} runs.")
        return run_ids


class TraceRequestSerializer(serializers.Serializer):
    steps = serializers.IntegerField(min_value=1, max_value=MAX_TRACE_STEPS)


class TraceSerializer(serializers.ModelSerializer):
    download_url = serializers.SerializerMethodField()

    class Meta:
        model = Trace
        fields = ["id", "run", "steps", "status", "requested_at", "captured_at", "first_step", "last_step",
                  "size_bytes", "error", "download_url"]

    def get_download_url(self, trace: Trace) -> str | None:
        if trace.status != Trace.Status.CAPTURED:
            return None
        path = reverse("api-run-trace-download", kwargs={"run_id": trace.run_id, "trace_id": trace.pk})
        request = self.context.get("request")
        return request.build_absolute_uri(path) if request is not None else path


class TraceUploadSerializer(serializers.Serializer):
    first_step = serializers.IntegerField(min_value=0)
    last_step = serializers.IntegerField(min_value=0)
    file = serializers.FileField(required=False)
    error = serializers.CharField(required=False, allow_blank=True, default="")


class ProducerProcessSerializer(serializers.Serializer):
    """A producer process as it last reported itself (tandem.contracts.ProducerReport)."""

    worker = serializers.CharField(help_text="hostname:pid of the process.")
    reported_at = serializers.FloatField(help_text="Unix time of its last report.")
    running_tasks = serializers.IntegerField()
    uptime_s = serializers.FloatField()
    cpu_s = serializers.FloatField(allow_null=True, help_text="CPU seconds since the process started.")
    rss_bytes = serializers.IntegerField(allow_null=True, help_text="Resident memory.")


def _snapshot(run):
    # A reverse one-to-one that select_related found empty raises rather than returning None.
    try:
        return run.device_snapshot
    except ObjectDoesNotExist:
        return None


class ActiveRunDevicesSerializer(serializers.Serializer):
    """An active run with its trainer's newest device report (None before the first) and its producers."""

    run = serializers.IntegerField(source="pk")
    name = serializers.CharField()
    project = serializers.CharField(source="project.name")
    status = serializers.CharField()
    url = serializers.SerializerMethodField()
    step = serializers.SerializerMethodField(help_text="The step whose event carried the report.")
    recorded_at = serializers.SerializerMethodField()
    report = serializers.SerializerMethodField(help_text="tandem.contracts.DeviceReport, with a row per device.")
    producers = serializers.SerializerMethodField(
        help_text="Producer processes of the run; null when Redis could not be read."
    )

    def get_url(self, run) -> str:
        return reverse("run-page", kwargs={"run_id": run.pk})

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_step(self, run) -> int | None:
        snapshot = _snapshot(run)
        return snapshot.step if snapshot else None

    @extend_schema_field(serializers.DateTimeField(allow_null=True))
    def get_recorded_at(self, run):
        snapshot = _snapshot(run)
        return snapshot.recorded_at if snapshot else None

    @extend_schema_field(serializers.DictField(allow_null=True))
    def get_report(self, run) -> dict | None:
        snapshot = _snapshot(run)
        return snapshot.report if snapshot else None

    @extend_schema_field(ProducerProcessSerializer(many=True, allow_null=True))
    def get_producers(self, run) -> list | None:
        producers = self.context["producers"]
        if producers is None:
            return None
        return [report.model_dump(include=set(ProducerProcessSerializer().fields))
                for report in producers.get(run.pk, [])]


#: The roles of a Tandem process (tandem.contracts.ProcessRole), named in the schema as ProcessRoleEnum.
PROCESS_ROLES = get_args(ProcessRole)


class ProcessRunSerializer(serializers.Serializer):
    run = serializers.IntegerField()
    url = serializers.CharField(help_text="The run's page.")


class ProcessSerializer(serializers.Serializer):
    """A Tandem process as it last reported itself (tandem.contracts.ProcessReport)."""

    role = serializers.ChoiceField(choices=PROCESS_ROLES)
    name = serializers.CharField(help_text="Celery node name, 'celery beat', or empty.")
    hostname = serializers.CharField()
    pid = serializers.IntegerField()
    started_at = serializers.FloatField(help_text="Unix time the process started.")
    reported_at = serializers.FloatField(help_text="Unix time of its last report.")
    interval_s = serializers.FloatField(help_text="Seconds between its reports.")
    uptime_s = serializers.SerializerMethodField(help_text="Seconds from its start to its last report.")
    cpu_cores = serializers.FloatField(help_text="CPU seconds per wall second since its previous report.")
    rss_bytes = serializers.IntegerField(help_text="Resident memory.")
    host_cpu_count = serializers.IntegerField(help_text="Logical CPUs of its host.")
    host_cpu_percent = serializers.FloatField(allow_null=True, help_text="Host CPU use, 0-100; null on a "
                                              "process's first report.")
    host_memory_used_bytes = serializers.IntegerField()
    host_memory_total_bytes = serializers.IntegerField()
    runs = serializers.SerializerMethodField(help_text="The runs of your projects it works on now.")
    other_runs = serializers.SerializerMethodField(
        help_text="How many runs of other projects it works on now (not named)."
    )

    def get_uptime_s(self, report) -> float:
        return max(report.reported_at - report.started_at, 0.0)

    @extend_schema_field(ProcessRunSerializer(many=True))
    def get_runs(self, report) -> list[dict]:
        visible = self.context["visible_run_ids"]
        return [{"run": run_id, "url": reverse("run-page", kwargs={"run_id": run_id})}
                for run_id in report.run_ids if run_id in visible]

    def get_other_runs(self, report) -> int:
        visible = self.context["visible_run_ids"]
        return sum(1 for run_id in report.run_ids if run_id not in visible)


class ProcessListSerializer(serializers.Serializer):
    processes = ProcessSerializer(many=True, allow_null=True,
                                  help_text="Every live Tandem process; null when Redis could not be read.")


class TimelineQuerySerializer(serializers.Serializer):
    """``?last=60&after_step=`` of a timeline query."""

    last = serializers.IntegerField(
        min_value=1, max_value=MAX_TIMELINE_STEPS, default=DEFAULT_TIMELINE_STEPS,
        help_text="The newest this many stored steps.",
    )
    after_step = serializers.IntegerField(
        required=False, help_text="Only steps after this one (a poll's cursor: the newest step it has)."
    )


def _described(model) -> dict:
    return {name: field.description or "" for name, field in model.model_fields.items()}


class TimelineStageSerializer(serializers.Serializer):
    name = serializers.CharField(help_text=_described(StageSpan)["name"])
    started_at = serializers.FloatField(help_text="Unix seconds, the trainer's clock.")
    ended_at = serializers.FloatField()


class TimelineEpisodeSerializer(serializers.Serializer):
    """tandem.contracts.EpisodeSpan, as the trainer posted it."""

    trajectory_id = serializers.CharField()
    group_id = serializers.CharField()
    environment = serializers.CharField()
    status = serializers.ChoiceField(choices=list(EPISODE_STATUSES))
    failure_reason = serializers.CharField(help_text=_described(EpisodeSpan)["failure_reason"])
    started_at = serializers.FloatField(help_text=_described(EpisodeSpan)["started_at"])
    finished_at = serializers.FloatField(help_text=_described(EpisodeSpan)["finished_at"])
    generation_s = serializers.FloatField()
    environment_s = serializers.FloatField()
    tool_s = serializers.FloatField()
    policy_version = serializers.IntegerField(help_text=_described(EpisodeSpan)["policy_version"])
    newest_policy_version = serializers.IntegerField()
    reward = serializers.FloatField(allow_null=True)
    outcome = serializers.ChoiceField(
        choices=list(get_args(EpisodeOutcome)),
        help_text=_described(EpisodeSpan)["outcome"],
    )


class TimelineStepSerializer(serializers.Serializer):
    step = serializers.IntegerField()
    phase = serializers.CharField()
    policy_version = serializers.IntegerField()
    started_at = serializers.FloatField()
    ended_at = serializers.FloatField()
    stages = TimelineStageSerializer(many=True, help_text="Contiguous, in order; they sum to the step's wall time.")
    episodes = TimelineEpisodeSerializer(many=True, help_text="Every episode the step consumed.")


class IdleShareSerializer(serializers.Serializer):
    environment = serializers.CharField()
    cause = serializers.ChoiceField(choices=list(IDLE_CAUSES), help_text=" ".join(
        f"{cause}: {meaning}." for cause, meaning in IDLE_CAUSES.items()))
    fraction = serializers.FloatField(help_text="Of the steps' wall time.")


class IdleSummarySerializer(serializers.Serializer):
    """What the trainer waited on over its newest steps (telemetry.selectors.idle_summary)."""

    steps = serializers.IntegerField(help_text="The steps it is over: the run's newest, up to 50.")
    idle_fraction = serializers.FloatField(help_text="The trainer's wait for data, of their wall time.")
    shares = IdleShareSerializer(many=True, help_text="That wait by environment and cause, largest first.")
    sentence = serializers.CharField(help_text="All of it in words, as the run and timeline pages show it.")


class RunIdleSerializer(serializers.Serializer):
    run = serializers.IntegerField()
    idle = IdleSummarySerializer(allow_null=True, help_text="Null before the run's first step.")


class TimelineSerializer(serializers.Serializer):
    run = serializers.IntegerField()
    status = serializers.CharField(help_text="The run's status: a page polls while it can still train.")
    steps_kept = serializers.IntegerField(help_text="Steps per run whose timeline the platform keeps.")
    newest_step = serializers.IntegerField(
        allow_null=True,
        help_text="The run's newest stored step, whatever after_step was: below a poll's cursor after a "
        "resume from an earlier checkpoint, when the poller should fetch the window anew.",
    )
    truncated = serializers.BooleanField(
        help_text="Fewer steps than `last`: older ones were left out to keep the answer within "
        "MAX_TIMELINE_EPISODES episodes.",
    )
    started_at = serializers.FloatField(allow_null=True, help_text="The window: its first step's start.")
    ended_at = serializers.FloatField(allow_null=True, help_text="Its last step's end.")
    steps = TimelineStepSerializer(many=True, help_text="Oldest first.")
    idle = IdleSummarySerializer(allow_null=True, help_text="What the trainer waited on over the run's newest "
                                 "steps; null before its first step.")
