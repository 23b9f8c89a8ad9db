from rest_framework import serializers

from .models import ApiToken, Membership, MetricExplorerLayout, Project


class ProjectSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username", help_text="Who created the project.")
    role = serializers.ChoiceField(
        choices=Membership.Role.choices,
        read_only=True,
        help_text="The caller's role in the project.",
    )

    class Meta:
        model = Project
        fields = ["id", "name", "owner", "role", "created_at"]


class ProjectCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)


class MembershipSerializer(serializers.ModelSerializer):
    username = serializers.CharField(source="user.username")

    class Meta:
        model = Membership
        fields = ["username", "role", "created_at"]


class MembershipCreateSerializer(serializers.Serializer):
    username = serializers.CharField(max_length=150)
    role = serializers.ChoiceField(choices=Membership.Role.choices, default=Membership.Role.MEMBER)


class MembershipUpdateSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=Membership.Role.choices)


class ApiTokenSerializer(serializers.ModelSerializer):
    prefix = serializers.CharField(help_text="The token's first characters, to tell tokens apart.")

    class Meta:
        model = ApiToken
        fields = ["id", "name", "prefix", "created_at", "last_used_at"]


class ApiTokenCreatedSerializer(ApiTokenSerializer):
    token = serializers.CharField(
        help_text="The raw token, for `Authorization: Token <token>`. Shown only this once."
    )

    class Meta(ApiTokenSerializer.Meta):
        fields = [*ApiTokenSerializer.Meta.fields, "token"]


class ApiTokenCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100, help_text="What the token is for, e.g. 'laptop'.")


# The x-axes a metric explorer panel offers (telemetry.selectors.MetricTable's columns).
EXPLORER_X_AXES = ["rl_step", "step", "wall_time_s", "samples_trained"]
MAX_EXPLORER_PANELS = 50


class MetricExplorerPanelSerializer(serializers.Serializer):
    pattern = serializers.CharField(max_length=200, help_text="A series name or a glob (`rollout/*/latency_p90_s`).")
    x_axis = serializers.ChoiceField(choices=EXPLORER_X_AXES, default="step")
    log_scale = serializers.BooleanField(default=False)
    y_min = serializers.FloatField(allow_null=True, default=None, help_text="null: from the data.")
    y_max = serializers.FloatField(allow_null=True, default=None, help_text="null: from the data.")

    def validate(self, attrs: dict) -> dict:
        if attrs["y_min"] is not None and attrs["y_max"] is not None and attrs["y_min"] >= attrs["y_max"]:
            raise serializers.ValidationError({"y_max": ["Must be greater than y_min."]})
        return attrs


class MetricExplorerLayoutSerializer(serializers.Serializer):
    page = serializers.ChoiceField(choices=MetricExplorerLayout.Page.choices)
    smoothing = serializers.FloatField(min_value=0, max_value=0.99, default=0.6,
                                       help_text="Weight of the exponential moving average (0: raw).")
    panels = MetricExplorerPanelSerializer(many=True, max_length=MAX_EXPLORER_PANELS)
