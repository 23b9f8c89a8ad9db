from django.contrib import admin

from .models import Environment, EnvironmentProbe, EnvironmentVersion


@admin.register(Environment)
class EnvironmentAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "project", "created_at"]


@admin.register(EnvironmentVersion)
class EnvironmentVersionAdmin(admin.ModelAdmin):
    list_display = ["id", "environment", "number", "kind", "status", "created_at"]
    list_filter = ["kind", "status"]
    # A version is immutable: a different definition is a new version.
    # EnvironmentVersionSecrets is not registered: the admin shows secret settings' names only.
    readonly_fields = ["environment", "number", "kind", "entrypoint", "settings", "secret_setting_names",
                       "tools", "created_by", "created_at"]


@admin.register(EnvironmentProbe)
class EnvironmentProbeAdmin(admin.ModelAdmin):
    list_display = ["id", "version", "purpose", "status", "requested_at", "duration_s"]
    list_filter = ["purpose", "status"]
