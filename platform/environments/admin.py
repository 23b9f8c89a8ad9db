from django.contrib import admin

from .models import Environment


@admin.register(Environment)
class EnvironmentAdmin(admin.ModelAdmin):
    list_display = ["id", "name", "project", "kind", "entrypoint", "created_at"]
    list_filter = ["kind"]
