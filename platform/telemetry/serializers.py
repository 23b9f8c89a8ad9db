"""Query parameters of the telemetry API."""

from rest_framework import serializers

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
