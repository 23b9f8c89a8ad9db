from rest_framework import serializers

from .models import Project


class ProjectSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username")
    role = serializers.CharField(read_only=True, help_text="The caller's role in the project.")

    class Meta:
        model = Project
        fields = ["id", "name", "owner", "role", "created_at"]


class ProjectCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
