"""The API's shapes of the workspace: its runs and series, saved views and reports."""

from rest_framework import serializers

from .models import Report, SavedView
from .selectors import MAX_SERIES_RUNS
from .view_state import MAX_METRICS

MAX_SERIES_POINTS = 2000
#: Buckets one series request may ask for at most (runs x names x points): an answer of a few megabytes.
MAX_SERIES_BUCKETS = 250_000


class SavedViewSerializer(serializers.ModelSerializer):
    created_by = serializers.CharField(source="created_by.username", allow_null=True, default=None)
    url = serializers.SerializerMethodField(help_text="The workspace page showing this view.")

    class Meta:
        model = SavedView
        fields = ["id", "project", "name", "query", "url", "created_by", "created_at", "updated_at"]

    def get_url(self, view: SavedView) -> str:
        separator = "&" if view.query else ""
        return f"/projects/{view.project_id}/workspace/?{view.query}{separator}view={view.pk}"


class SavedViewWriteSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    query = serializers.CharField(allow_blank=True, max_length=4000, help_text=(
        "The workspace's query string (filters, panels, axes, zoom and range, columns), e.g. "
        "'m=reward_mean,loss&g=config.algorithm.learning_rate&z=0,200'. Stored canonical."))
    replace = serializers.BooleanField(default=False, help_text="Overwrite the view of that name, if there is one.")


class SavedViewUpdateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100, required=False)
    query = serializers.CharField(allow_blank=True, max_length=4000, required=False)


class ReportSerializer(serializers.ModelSerializer):
    created_by = serializers.CharField(source="created_by.username", allow_null=True, default=None)
    updated_by = serializers.CharField(source="updated_by.username", allow_null=True, default=None)

    class Meta:
        model = Report
        fields = ["id", "project", "title", "body", "created_by", "updated_by", "created_at", "updated_at"]


class ReportWriteSerializer(serializers.Serializer):
    title = serializers.CharField(max_length=200)
    body = serializers.CharField(allow_blank=True, required=False, default="", trim_whitespace=False, help_text=(
        "Markdown; a line '{{view: <name>}}' embeds that saved view's live panels."))


class ReportUpdateSerializer(serializers.Serializer):
    title = serializers.CharField(max_length=200, required=False)
    body = serializers.CharField(allow_blank=True, required=False, trim_whitespace=False)


class SeriesQuerySerializer(serializers.Serializer):
    runs = serializers.CharField(help_text=f"Comma-separated run ids of the project, at most {MAX_SERIES_RUNS}.")
    names = serializers.CharField(help_text=f"Comma-separated metric names, at most {MAX_METRICS}.")
    points = serializers.IntegerField(min_value=10, max_value=MAX_SERIES_POINTS, default=100,
                                      help_text="Buckets wanted per series: the answer has between this and twice as many.")
    from_step = serializers.IntegerField(required=False, allow_null=True, default=None)
    to_step = serializers.IntegerField(required=False, allow_null=True, default=None)

    def validate_runs(self, value: str) -> list[int]:
        try:
            ids = [int(part) for part in value.split(",") if part.strip()]
        except ValueError:
            raise serializers.ValidationError("Comma-separated run ids.") from None
        if not ids:
            raise serializers.ValidationError("At least one run.")
        if len(ids) > MAX_SERIES_RUNS:
            raise serializers.ValidationError(f"At most {MAX_SERIES_RUNS} runs, not {len(ids)}.")
        return ids

    def validate(self, data: dict) -> dict:
        asked = len(data["runs"]) * len(data["names"]) * data["points"]
        if asked > MAX_SERIES_BUCKETS:
            raise serializers.ValidationError({"points": [
                f"{len(data['runs'])} runs x {len(data['names'])} names x {data['points']} points is {asked:,} "
                f"buckets; at most {MAX_SERIES_BUCKETS:,} a request: ask for fewer points or runs."]})
        return data

    def validate_names(self, value: str) -> list[str]:
        names = list(dict.fromkeys(name.strip() for name in value.split(",") if name.strip()))
        if not names or len(names) > MAX_METRICS:
            raise serializers.ValidationError(f"1 to {MAX_METRICS} metric names.")
        return names
