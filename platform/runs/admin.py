from django.contrib import admin

from .models import Run


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "project", "environment", "status", "trainer_step", "created_at"]
    list_filter = ["status"]
    # Status changes go through run_transition, never through a form.
    readonly_fields = ["status", "status_reason", "started_at", "finished_at", "claimed_by"]
