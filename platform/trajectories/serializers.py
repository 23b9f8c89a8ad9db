from django.urls import reverse
from rest_framework import serializers

from tandem.contracts import sample_purpose_choices

from .models import TrajectorySample


class TrajectorySampleSummarySerializer(serializers.ModelSerializer):
    """A sample as lists show it: everything but the turns."""

    id = serializers.CharField(source="trajectory_id")
    url = serializers.SerializerMethodField()

    class Meta:
        model = TrajectorySample
        fields = [
            "id",
            "run",
            "step",
            "selected_because",
            "purpose",
            "environment",
            "status",
            "failure_reason",
            "reward",
            "policy_version",
            "num_turns",
            "num_tokens",
            "trained_tokens",
            "recorded_at",
            "url",
        ]

    def get_url(self, sample: TrajectorySample) -> str:
        return reverse("api-run-trajectory-detail", args=[sample.run_id, sample.trajectory_id])


class TrajectorySampleSerializer(TrajectorySampleSummarySerializer):
    """The whole sample: the summary, ``policy_versions`` and ``turns`` with their token spans."""

    policy_versions = serializers.SerializerMethodField()
    turns = serializers.SerializerMethodField()

    class Meta(TrajectorySampleSummarySerializer.Meta):
        fields = [*TrajectorySampleSummarySerializer.Meta.fields, "policy_versions", "group_id", "turns"]

    group_id = serializers.SerializerMethodField()

    def get_policy_versions(self, sample: TrajectorySample) -> list[int]:
        return sample.payload.get("policy_versions", [])

    def get_group_id(self, sample: TrajectorySample) -> str:
        return sample.payload.get("group_id", "")

    def get_turns(self, sample: TrajectorySample) -> list[dict]:
        return sample.payload.get("turns", [])


class TrajectoryFiltersSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=TrajectorySample.Status.choices, required=False)
    environment = serializers.CharField(max_length=200, required=False)
    purpose = serializers.ChoiceField(choices=sample_purpose_choices(), required=False,
                                      help_text="training or evaluation (held-out, never trained on).")
    min_reward = serializers.FloatField(required=False)
    max_reward = serializers.FloatField(required=False)
