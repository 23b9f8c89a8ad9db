"""Shapes of telemetry's API: trace requests in, traces out, and the trainer's uploads."""

from django.urls import reverse
from rest_framework import serializers

from .models import Trace
from .services import MAX_TRACE_STEPS


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
