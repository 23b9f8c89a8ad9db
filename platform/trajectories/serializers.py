from django.urls import reverse
from rest_framework import serializers

from common.stored_text import json_text_map, json_text_unescape, text_for_page, text_unescape
from tandem.contracts import TrajectorySample as TrajectorySampleRecord
from tandem.contracts import sample_purpose_choices

from .models import TrajectorySample
from .selectors import TOOL_USE_FILTERS


class StoredTextField(serializers.CharField):
    """A column of text stored escaped (common/stored_text.py), shown as it was sent."""

    def to_representation(self, value) -> str:
        return text_unescape(super().to_representation(value))


class TrajectorySampleSummarySerializer(serializers.ModelSerializer):
    """A sample as lists show it: everything but the turns."""

    id = StoredTextField(source="trajectory_id")
    environment = StoredTextField()
    failure_reason = StoredTextField()
    group_id = StoredTextField()
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
            "group_id",
            "group_size",
            "advantage",
            "recorded_at",
            "url",
        ]

    def get_url(self, sample: TrajectorySample) -> str:
        return reverse("api-run-trajectory-detail", args=[sample.run_id, sample.trajectory_id])


class TrajectorySampleSerializer(TrajectorySampleSummarySerializer):
    """The whole sample: the summary, ``policy_versions`` and ``turns`` with their token spans."""

    policy_versions = serializers.SerializerMethodField()
    token_values = serializers.SerializerMethodField(
        help_text="included: spans carry per-token pieces, logprobs and advantages; left_out_for_size: the "
        "trainer dropped them to keep its posts small; not_recorded: a sample stored before they were sent.")
    turns = serializers.SerializerMethodField()

    class Meta(TrajectorySampleSummarySerializer.Meta):
        fields = [*TrajectorySampleSummarySerializer.Meta.fields, "policy_versions", "token_values", "turns"]

    def get_policy_versions(self, sample: TrajectorySample) -> list[int]:
        return sample.payload.get("policy_versions", [])

    def get_token_values(self, sample: TrajectorySample) -> str:
        return stored_sample(sample).token_values

    def get_turns(self, sample: TrajectorySample) -> list[dict]:
        # Python's dump: JSON's would refuse a lone surrogate, which the renderer writes escaped.
        return stored_sample(sample).model_dump()["turns"]


def stored_sample(sample: TrajectorySample) -> TrajectorySampleRecord:
    """The stored payload read through the contract, so a schema 1 sample comes out upgraded, and
    unescaped: its text exactly as the trainer sent it, NUL characters and lone surrogates included.

    Cached on the row: a serializer reads it for several fields.
    """
    record = getattr(sample, "_record", None)
    if record is None:
        record = sample._record = TrajectorySampleRecord.model_validate(json_text_unescape(sample.payload))
    return record


def sample_for_page(sample: TrajectorySample) -> TrajectorySampleRecord:
    """The sample as a web page can show it: NUL as ␀, a lone surrogate written as its escape
    (common/stored_text.py: text_for_page); the API's JSON shows them as they are."""
    record = getattr(sample, "_page_record", None)
    if record is None:
        payload = json_text_map(sample.payload, lambda text: text_for_page(text_unescape(text)))
        record = sample._page_record = TrajectorySampleRecord.model_validate(payload)
    return record


class TrajectoryFiltersSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=TrajectorySample.Status.choices, required=False)
    environment = serializers.CharField(max_length=200, required=False)
    purpose = serializers.ChoiceField(choices=sample_purpose_choices(), required=False,
                                      help_text="training or evaluation (held-out, never trained on).")
    min_reward = serializers.FloatField(required=False)
    max_reward = serializers.FloatField(required=False)
    q = serializers.CharField(max_length=200, required=False, trim_whitespace=True,
                              help_text="Text in any of its turns, any case.")
    tool_use = serializers.ChoiceField(
        choices=[(name, label) for name, (label, _) in TOOL_USE_FILTERS.items()], required=False,
        help_text="called: a call of its tools ran; not_called: none did; unparsed: a turn's tool-call markup "
        "did not parse; failed: a turn's markup made no call that ran (did not parse, unknown tool, invalid "
        "arguments, or the tool refused it).")

    def validate(self, attrs):
        # The selector's filter is named for what it matches; ``q`` is the query string's name for it.
        if "q" in attrs:
            attrs["text"] = attrs.pop("q")
        return attrs


class TrajectoryGroupSerializer(serializers.Serializer):
    """A group's sampled episodes side by side, each a whole sample, highest advantage first."""

    run = serializers.IntegerField()
    group_id = serializers.CharField()
    group_size = serializers.IntegerField(allow_null=True, help_text="Episodes of the group; null for old samples.")
    steps = serializers.ListField(child=serializers.IntegerField(), help_text="Steps that trained on them.")
    episodes = TrajectorySampleSerializer(many=True)
