from rest_framework import serializers

from tandem.contracts import EVALUATION_STATUSES, EvaluationProgress

from .models import Evaluation
from .series import evaluation_series_label


class EvaluationSerializer(serializers.ModelSerializer):
    # Typed for the schema: a JSONField alone would be documented as any value.
    metrics = serializers.DictField(child=serializers.FloatField(), help_text="EVALUATION_METRICS, pass@k and avg@k.")
    intervals = serializers.DictField(
        child=serializers.ListField(child=serializers.FloatField(), min_length=2, max_length=2),
        help_text="95% intervals [low, high] of the metrics that have one.",
    )
    trajectory_ids = serializers.ListField(child=serializers.CharField(), help_text="Ids of its episodes.")
    series_label = serializers.SerializerMethodField(
        help_text="What its metric series names hold between 'eval/' and the metric (a long label cut with a hash).")

    class Meta:
        model = Evaluation
        fields = ["run", "index", "step", "policy_version", "kind", "environment", "series_label", "status",
                  "reason", "tasks", "samples_per_task", "temperature", "episodes", "metrics", "intervals", "trajectory_ids",
                  "created_at", "updated_at"]

    def get_series_label(self, evaluation: Evaluation) -> str:
        return evaluation_series_label(kind=evaluation.kind, label=evaluation.environment)


class EvaluationRunCreateSerializer(serializers.Serializer):
    step = serializers.IntegerField(
        required=False, allow_null=True, default=None, min_value=0, max_value=2**31 - 1,
        help_text="A kept checkpoint's step; null: the newest kept one.")
    evaluation = serializers.DictField(
        required=False, allow_null=True, default=None,
        help_text="The evaluation config section (every_steps aside, as for a run); null: the run's own, "
        "or the defaults.")
    name = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


def _described(field: str) -> str:
    return EvaluationProgress.model_fields[field].description or ""


class EvaluationProgressSerializer(serializers.Serializer):
    """One ``tandem.contracts.EvaluationProgress``, as the trainer keeps it."""

    evaluation = serializers.IntegerField(min_value=0, help_text="The evaluation's index in its run (0, 1, ...).")
    policy_version = serializers.IntegerField(min_value=0)
    episodes_expected = serializers.IntegerField(min_value=0, help_text=_described("episodes_expected"))
    episodes_received = serializers.IntegerField(min_value=0, help_text=_described("episodes_received"))
    status = serializers.ChoiceField(choices=["running", *EVALUATION_STATUSES], help_text=_described("status"))


class EvaluationProgressListSerializer(serializers.Serializer):
    run = serializers.IntegerField()
    evaluations = EvaluationProgressSerializer(
        many=True, allow_null=True,
        help_text="Each evaluation the trainer asked for, first one first; null when Redis could not be read.")
