from django.urls import reverse
from rest_framework import serializers

from .models import Checkpoint


class CheckpointSerializer(serializers.ModelSerializer):
    download_url = serializers.SerializerMethodField(help_text="Set once exported to safetensors.")

    class Meta:
        model = Checkpoint
        fields = ["id", "run", "step", "policy_version", "path", "size_bytes", "created_at", "status",
                  "deleted_reason", "deleted_at", "export_status", "export_error", "download_url"]

    def get_download_url(self, checkpoint: Checkpoint) -> str | None:
        if checkpoint.status != Checkpoint.Status.AVAILABLE or checkpoint.export_status != Checkpoint.ExportStatus.EXPORTED:
            return None
        path = reverse("api-run-checkpoint-download", kwargs={"run_id": checkpoint.run_id, "step": checkpoint.step})
        request = self.context.get("request")
        return request.build_absolute_uri(path) if request is not None else path
