"""Platform worker tasks of checkpoints; thin: they call a service."""

from celery import shared_task

from .services import EXPORT_TASK_NAME, checkpoint_export_run


# On the platform's "platform" queue (CELERY_TASK_DEFAULT_QUEUE); an export of a
# large model reads and writes gigabytes, hence the generous limit.
@shared_task(name=EXPORT_TASK_NAME, time_limit=3600, soft_time_limit=3500)
def export_checkpoint(checkpoint_id: int) -> str:
    """Write the checkpoint as safetensors next to it; returns the export status."""
    return checkpoint_export_run(checkpoint_id=checkpoint_id).export_status
