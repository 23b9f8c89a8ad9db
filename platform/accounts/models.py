from django.conf import settings
from django.db import models


class Project(models.Model):
    """A namespace for environments and runs, shared by its members."""

    name = models.CharField(max_length=100)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="owned_projects"
    )
    members = models.ManyToManyField(
        settings.AUTH_USER_MODEL, through="Membership", related_name="projects"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name", "id"]
        constraints = [
            models.UniqueConstraint(fields=["owner", "name"], name="project_name_unique_per_owner"),
        ]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    class Role(models.TextChoices):
        OWNER = "owner", "Owner"
        MEMBER = "member", "Member"
        VIEWER = "viewer", "Viewer"

    # Roles that may register environments and start or cancel runs.
    WRITER_ROLES = frozenset({Role.OWNER, Role.MEMBER})

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "user"], name="membership_unique_per_user"),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.project} ({self.role})"


class ApiToken(models.Model):
    """A named API token of a user. Only a hash of its secret is kept.

    The raw value is shown once, when the token is created; ``prefix`` (its first
    characters, not enough to guess the rest) lets people tell their tokens apart.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16)
    # sha256 of the whole raw token, hex. The secret has 256 bits of entropy, so a
    # fast unsalted hash is enough: there is nothing to brute-force.
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["user", "name"], name="api_token_name_unique_per_user"),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class MetricExplorerLayout(models.Model):
    """A user's metric explorer on one kind of page: the panels they added and each panel's options.

    One per user and page, whatever the run: the same panels open on every run (or comparison), as a
    workspace does. ``layout`` is ``{"smoothing": float, "panels": [{pattern, x_axis, log_scale, y_min,
    y_max}]}``, validated by ``MetricExplorerLayoutSerializer`` before it is stored.
    """

    class Page(models.TextChoices):
        RUN = "run", "Run page"
        COMPARE = "compare", "Comparison"

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="metric_explorer_layouts"
    )
    page = models.CharField(max_length=16, choices=Page.choices)
    layout = models.JSONField(default=dict)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "page"], name="metric_explorer_layout_unique_per_page"),
        ]

    def __str__(self) -> str:
        return f"{self.user}'s metric explorer on the {self.page} page"
