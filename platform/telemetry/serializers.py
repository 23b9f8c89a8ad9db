"""Shapes of telemetry's API: chart and timeline queries, trace requests in, traces out, and the
trainer's uploads."""

from typing import get_args

from django.urls import reverse
from rest_framework import serializers

from tandem.contracts import EpisodeOutcome, EpisodeSpan, StageSpan

from .models import Trace
from .services import MAX_TRACE_STEPS

MAX_CHART_POINTS = 10_000
MAX_CHART_SERIES = 50
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
    status = serializers.ChoiceField(choices=["ok", "failed"])
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


class TimelineSerializer(serializers.Serializer):
    run = serializers.IntegerField()
    status = serializers.CharField(help_text="The run's status: a page polls while it can still train.")
    steps_kept = serializers.IntegerField(help_text="Steps per run whose timeline the platform keeps.")
    started_at = serializers.FloatField(allow_null=True, help_text="The window: its first step's start.")
    ended_at = serializers.FloatField(allow_null=True, help_text="Its last step's end.")
    steps = TimelineStepSerializer(many=True, help_text="Oldest first.")
