"""Platform worker tasks of checkpoints; thin: they call a service.

The export itself runs on the export worker (trainer/export_worker.py, queue ``exports``), where
JAX is; the platform only records what it reports, a short database write on the platform queue.
"""

from django.db import OperationalError

from common.tasks import platform_task
from tandem.contracts import (
    CHECKPOINT_EXPORT_REPORT,
    EXPIRE_CHECKPOINT_EXPORTS,
    CheckpointExportReport,
)

from .services import checkpoint_export_record, checkpoint_exports_expire


# A deadlock or a lost connection is transient: the report is recorded on a later try rather than lost.
@platform_task(CHECKPOINT_EXPORT_REPORT, soft_time_limit=30, time_limit=60,
               autoretry_for=(OperationalError,), retry_backoff=1, retry_backoff_max=30, max_retries=6)
def record_checkpoint_export(report: dict) -> str | None:
    """Store an export's outcome (a CheckpointExportReport as JSON); returns the export status."""
    checkpoint = checkpoint_export_record(report=CheckpointExportReport.model_validate(report))
    return None if checkpoint is None else checkpoint.export_status


@platform_task(EXPIRE_CHECKPOINT_EXPORTS, soft_time_limit=30, time_limit=60)
def expire_checkpoint_exports() -> int:
    """Celery beat's sweep: fail the exports no export worker reported in time; returns how many."""
    return checkpoint_exports_expire()
