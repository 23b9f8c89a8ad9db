from django.conf import settings as django_settings
from django.db import models
from django.db.models import Q


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
    The web process checks the file and keeps it under the media root; the datasets
    worker stores its rows in batches (``status`` and ``rows_stored`` say how far).
    """

    class Source(models.TextChoices):
        UPLOAD = "upload", "Uploaded file"
        PATH = "path", "File on the platform's host"

    class Status(models.TextChoices):
        CHECKING = "checking", "Being checked"  # the web process reads the file
        PENDING = "pending", "Waiting for the datasets worker"
        STORING = "storing", "Being stored"
        READY = "ready", "Ready"
        FAILED = "failed", "Failed"

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
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.READY)
    rows_stored = models.PositiveIntegerField(default=0, help_text="Rows the worker has committed so far.")
    failure_reason = models.TextField(blank=True, help_text="Why storing failed (status failed).")
    # The checked file under the media root, relative to it, until the worker has stored its rows.
    kept_file = models.CharField(max_length=255, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["dataset_id", "-number"]
        constraints = [
            models.UniqueConstraint(fields=["dataset", "number"], name="dataset_version_number_unique"),
            # One upload per user at a time: a second, while the first is checked or stored, is refused.
            models.UniqueConstraint(fields=["created_by"], name="dataset_one_upload_per_user",
                                    condition=Q(status__in=["checking", "pending", "storing"])),
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


class DatasetTokenStats(models.Model):
    """Token counts of a version under one tokenizer, computed once by the datasets worker."""

    class Status(models.TextChoices):
        COMPUTING = "computing", "Computing"
        READY = "ready", "Ready"
        FAILED = "failed", "Failed"

    version = models.ForeignKey(DatasetVersion, on_delete=models.CASCADE, related_name="token_stats")
    tokenizer = models.CharField(max_length=1024, help_text="A tokenizer choice's value: byte, or a model directory.")
    status = models.CharField(max_length=9, choices=Status.choices, default=Status.COMPUTING)
    rows = models.PositiveIntegerField(default=0)
    tokens = models.BigIntegerField(default=0)
    assistant_tokens = models.BigIntegerField(default=0)
    mean_tokens_per_row = models.FloatField(default=0.0)
    max_tokens_per_row = models.BigIntegerField(default=0)
    failure_reason = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    computed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["version", "tokenizer"], name="dataset_token_stats_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.tokenizer} tokens of {self.version_id}"
