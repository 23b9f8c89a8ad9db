from rest_framework import serializers

from .models import ApiToken, Membership, Project


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
