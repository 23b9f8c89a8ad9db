from django.contrib import admin

from .models import Dataset, DatasetVersion


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "project", "created_at"]


@admin.register(DatasetVersion)
class DatasetVersionAdmin(admin.ModelAdmin):
    list_display = ["id", "dataset", "number", "status", "row_count", "size_bytes", "created_at"]
    # A version is immutable: different rows are a new version.
    readonly_fields = ["dataset", "number", "source", "source_name", "size_bytes", "sha256", "row_count",
                       "message_count", "role_counts", "created_by", "created_at", "status", "rows_stored",
                       "failure_reason", "kept_file", "updated_at"]
