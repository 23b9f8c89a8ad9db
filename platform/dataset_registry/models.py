from django.conf import settings as django_settings
from django.db import models


class Dataset(models.Model):
    """A name in a project under which SFT dataset versions are registered."""

    project = models.ForeignKey("accounts.Project", on_delete=models.CASCADE, related_name="datasets")
    name = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name", "id"]
        constraints = [
            models.UniqueConstraint(fields=["project", "name"], name="dataset_name_unique_per_project"),
        ]

    def __str__(self) -> str:
        return self.name


class DatasetVersion(models.Model):
    """One immutable upload of a dataset: its rows never change (a new upload is a new version).

    Runs pin the number of the version they train on, in their config's ``sft.datasets``.
    """

    class Source(models.TextChoices):
        UPLOAD = "upload", "Uploaded file"
        PATH = "path", "File on the platform's host"

    dataset = models.ForeignKey(Dataset, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField(help_text="1, 2, ... within the dataset.")
    source = models.CharField(max_length=8, choices=Source.choices)
    source_name = models.CharField(max_length=255, help_text="The uploaded file's name, or the path read.")
    size_bytes = models.BigIntegerField()
    sha256 = models.CharField(max_length=64, help_text="Of the file as received.")
    row_count = models.PositiveIntegerField()
    message_count = models.PositiveIntegerField()
    # Messages by role, e.g. {"user": 10, "assistant": 12}: what the list shows without reading rows.
    role_counts = models.JSONField(default=dict)
    created_by = models.ForeignKey(
        django_settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["dataset_id", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["dataset", "number"], name="dataset_version_number_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.dataset.name}@{self.number}"


class DatasetRow(models.Model):
    """One conversation of a version, as ``tandem.contracts.DatasetRow.stored`` writes it."""

    version = models.ForeignKey(DatasetVersion, on_delete=models.CASCADE, related_name="rows")
    index = models.PositiveIntegerField(help_text="0-based position in the file (its line, less blank lines).")
    line = models.PositiveIntegerField(help_text="1-based line of the file it came from.")
    messages = models.JSONField()
    metadata = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["version_id", "index"]
        constraints = [
            # Also the index of the trainer's pages (version, offset ...).
            models.UniqueConstraint(fields=["version", "index"], name="dataset_row_index_unique"),
        ]

    def __str__(self) -> str:
        return f"row {self.index} of {self.version_id}"
