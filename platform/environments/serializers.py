from rest_framework import serializers

from config.db_limits import require_no_nul

from .models import Environment


class EnvironmentSerializer(serializers.ModelSerializer):
    class Meta:
        model = Environment
        fields = ["id", "project", "name", "kind", "entrypoint", "params", "created_at"]


class EnvironmentRegisterSerializer(serializers.Serializer):
    project = serializers.IntegerField(
        required=False, allow_null=True, help_text="Defaults to the caller's only project."
    )
    name = serializers.CharField(max_length=100)
    kind = serializers.ChoiceField(
        choices=Environment.Kind.choices, default=Environment.Kind.PYTHON
    )
    entrypoint = serializers.CharField(max_length=255)
    params = serializers.DictField(required=False, default=dict)

    def validate_params(self, params: dict) -> dict:
        require_no_nul(params, "params")  # jsonb cannot hold one
        return params
