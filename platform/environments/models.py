from django.db import models

from tandem.contracts import EnvironmentSpec


class Environment(models.Model):
    """An environment class that rollout producers load by its entrypoint."""

    class Kind(models.TextChoices):
        PYTHON = "python", "Python class"

    project = models.ForeignKey(
        "accounts.Project", on_delete=models.CASCADE, related_name="environments"
    )
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.PYTHON)
    entrypoint = models.CharField(
        max_length=255, help_text="`module:Class`, importable by producers."
    )
    params = models.JSONField(
        default=dict, blank=True, help_text="Keyword arguments for the class."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name", "id"]
        constraints = [
            models.UniqueConstraint(
                fields=["project", "name"], name="environment_name_unique_per_project"
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def to_spec(self) -> EnvironmentSpec:
        """The environment as the cross-process contract describes it to producers."""
        return EnvironmentSpec(
            name=self.name, kind=self.kind, entrypoint=self.entrypoint, params=self.params
        )
