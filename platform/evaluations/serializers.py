from rest_framework import serializers

from .models import Evaluation


class EvaluationSerializer(serializers.ModelSerializer):
    # Typed for the schema: a JSONField alone would be documented as any value.
    metrics = serializers.DictField(child=serializers.FloatField(), help_text="EVALUATION_METRICS, pass@k and avg@k.")
    intervals = serializers.DictField(
        child=serializers.ListField(child=serializers.FloatField(), min_length=2, max_length=2),
        help_text="95% intervals [low, high] of the metrics that have one.",
    )
    trajectory_ids = serializers.ListField(child=serializers.CharField(), help_text="Ids of its episodes.")

    class Meta:
        model = Evaluation
        fields = ["run", "index", "step", "policy_version", "environment", "status", "reason", "tasks",
                  "samples_per_task", "temperature", "episodes", "metrics", "intervals", "trajectory_ids",
                  "created_at", "updated_at"]
