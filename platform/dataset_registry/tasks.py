"""Tasks of the datasets worker (queue ``platform-datasets``, prefork, so the time limits hold); thin: they call a service.

A version's rows are stored, and its token statistics counted, away from the web
process and from the platform queue's short writes (probe reports, the reaper).
"""

from __future__ import annotations

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings

from common.tasks import platform_task
from tandem.contracts import DATASET_STORE_VERSION, DATASET_TOKEN_STATS

from .services import dataset_version_fail, dataset_version_store, version_token_stats_compute


# acks_late with reject_on_worker_lost: a worker killed mid-version hands the version to the next
# one, which goes on from the rows already stored.
@platform_task(DATASET_STORE_VERSION, acks_late=True, reject_on_worker_lost=True,
               soft_time_limit=settings.TANDEM_DATASET_STORE_TIME_LIMIT_S,
               time_limit=settings.TANDEM_DATASET_STORE_TIME_LIMIT_S + 60)
def store_dataset_version(version_id: int) -> None:
    """Store the rows of a pending dataset version from the file the web process kept."""
    try:
        dataset_version_store(version_id=version_id)
    except SoftTimeLimitExceeded:
        dataset_version_fail(version_id=version_id, reason=(
            f"Storing took longer than {settings.TANDEM_DATASET_STORE_TIME_LIMIT_S} s "
            "(TANDEM_DATASET_STORE_TIME_LIMIT_S)."))


# Counting 2,000 rows with a model's tokenizer takes about a minute at worst.
@platform_task(DATASET_TOKEN_STATS, soft_time_limit=300, time_limit=360)
def compute_token_stats(stats_id: int) -> None:
    """Count a version's tokens under one tokenizer, once, and store the counts."""
    version_token_stats_compute(stats_id=stats_id)
