"""The Orbax checkpoints of runs as their trainers report them, and their safetensors exports."""

from django.db import models

from tandem.contracts import CheckpointExportStatus, CheckpointStatus


class Checkpoint(models.Model):
    """One checkpoint step of a run on the shared filesystem; kept as ``deleted`` once its files are gone."""

    class Status(models.TextChoices):
        AVAILABLE = CheckpointStatus.AVAILABLE.value, "Available"
        DELETED = CheckpointStatus.DELETED.value, "Deleted"

    class ExportStatus(models.TextChoices):
        NONE = CheckpointExportStatus.NONE.value, "Not exported"
        EXPORTING = CheckpointExportStatus.EXPORTING.value, "Exporting"
        EXPORTED = CheckpointExportStatus.EXPORTED.value, "Exported"
        FAILED = CheckpointExportStatus.FAILED.value, "Failed"

    run = models.ForeignKey("runs.Run", on_delete=models.CASCADE, related_name="checkpoints")
    step = models.PositiveIntegerField(help_text="Updates the checkpointed train state holds.")
    policy_version = models.IntegerField(help_text="Newest policy version published when it was saved.")
    path = models.CharField(max_length=1000, help_text="The step directory on the shared filesystem.")
    size_bytes = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.AVAILABLE)
    deleted_reason = models.CharField(max_length=200, blank=True, default="")
    deleted_at = models.DateTimeField(null=True, blank=True)
    export_status = models.CharField(max_length=16, choices=ExportStatus.choices, default=ExportStatus.NONE)
    export_path = models.CharField(
        max_length=1000, blank=True, default="", help_text="Directory of the Hugging Face export (safetensors)."
    )
    export_error = models.TextField(blank=True, default="")
    export_requested_at = models.DateTimeField(
        null=True, blank=True, help_text="When the newest export was asked for (its expiry counts from it)."
    )

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "step"], name="checkpoint_unique_run_step")]
        ordering = ["-step"]

    def __str__(self) -> str:
        return f"run {self.run_id} step {self.step} ({self.status})"
