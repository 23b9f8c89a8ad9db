"""A project's workspace across runs: its saved views, and the reports that embed them.

A view is what the workspace's URL says (``workspaces.view_state``): the runs a filter selects, the
metrics drawn, their grouping, axes, zoom and table columns. Saving it keeps that query under a name.
"""

from django.conf import settings
from django.db import models


class SavedView(models.Model):
    project = models.ForeignKey("accounts.Project", on_delete=models.CASCADE, related_name="saved_views")
    name = models.CharField(max_length=100)
    # The workspace's query string, canonical (workspaces.view_state.WorkspaceView.query()).
    query = models.TextField()
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "id"]
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="saved_view_name_unique_per_project"),
        ]

    def __str__(self) -> str:
        return f"{self.name} (view of project {self.project_id})"


class Report(models.Model):
    """Markdown written by a project member; a line ``{{view: <name>}}`` embeds that saved view's panels,
    drawn live from the project's runs whenever the report is read."""

    project = models.ForeignKey("accounts.Project", on_delete=models.CASCADE, related_name="reports")
    title = models.CharField(max_length=200)
    body = models.TextField(blank=True, default="")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    updated_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at", "-id"]

    def __str__(self) -> str:
        return f"{self.title} (report {self.pk})"
