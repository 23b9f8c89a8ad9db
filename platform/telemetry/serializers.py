"""Shapes of telemetry's API: chart queries, trace requests in, traces out, and the trainer's uploads."""

from django.urls import reverse
from rest_framework import serializers

from .models import Trace
from .services import MAX_TRACE_STEPS

MAX_CHART_POINTS = 10_000
MAX_CHART_SERIES = 50


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
