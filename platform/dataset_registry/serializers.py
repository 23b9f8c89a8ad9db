from rest_framework import serializers

from .models import Dataset, DatasetRow, DatasetVersion


class DatasetRegisterSerializer(serializers.Serializer):
    """A new version of ``name`` (version 1 if the name is new): an uploaded ``file`` or a ``path``."""

    project = serializers.IntegerField(required=False, allow_null=True,
                                       help_text="Defaults to the caller's only project.")
    name = serializers.CharField(max_length=100)
    file = serializers.FileField(required=False, help_text="JSONL, one conversation a line (multipart).")
    path = serializers.CharField(required=False, max_length=4096,
                                 help_text="A JSONL file on the platform's host, under TANDEM_DATASET_ROOTS.")

    def validate(self, data):
        unknown = sorted(set(self.initial_data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({key: ["Unknown field."] for key in unknown})
        if ("file" in data) == ("path" in data):
            raise serializers.ValidationError({"file": ["Send either a file (multipart) or a path, not both."]})
        return data


class DatasetVersionSerializer(serializers.ModelSerializer):
    created_by = serializers.CharField(source="created_by.username", default=None)

    class Meta:
        model = DatasetVersion
        fields = ["id", "number", "status", "rows_stored", "failure_reason", "source", "source_name", "size_bytes",
                  "sha256", "row_count", "message_count", "role_counts", "created_by", "created_at"]


class DatasetSerializer(serializers.ModelSerializer):
    """A dataset with its latest version; ``versions`` must be prefetched newest first."""

    latest_version = serializers.SerializerMethodField()

    class Meta:
        model = Dataset
        fields = ["id", "project", "name", "created_at", "latest_version"]

    def get_latest_version(self, dataset: Dataset) -> dict | None:
        versions = dataset.versions.all()
        return DatasetVersionSerializer(versions[0]).data if versions else None


class DatasetDetailSerializer(DatasetSerializer):
    versions = DatasetVersionSerializer(many=True)

    class Meta(DatasetSerializer.Meta):
        fields = [*DatasetSerializer.Meta.fields, "versions"]


class DatasetRowSerializer(serializers.ModelSerializer):
    class Meta:
        model = DatasetRow
        fields = ["index", "line", "messages", "metadata"]


class RowsQuerySerializer(serializers.Serializer):
    offset = serializers.IntegerField(min_value=0, default=0)
    limit = serializers.IntegerField(min_value=1, max_value=1000, default=100)
