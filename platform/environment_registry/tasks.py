"""Celery tasks of the environment registry, run by the platform's worker (queue `platform`).

The probe itself runs on a rollout worker (workers/tasks.py); these record
what it reports and start the periodic health checks. Both take plain data,
load fresh state and call one service. The platform worker runs the solo
pool, where Celery enforces no time limit; the limits below hold under
prefork and document what each task should take.
"""

from __future__ import annotations

import logging

from django.db import OperationalError

from common.domain_errors import NotFound
from common.tasks import platform_task
from tandem.contracts import HEALTH_SWEEP, PROBE_REPORT, ProbeReport

from .services import environment_health_sweep, environment_probe_record

logger = logging.getLogger(__name__)


# A deadlock or a lost connection is transient: the report is recorded on a later try rather than
# lost, which would leave its probe pending and its environment's runs waiting.
@platform_task(PROBE_REPORT, soft_time_limit=30, time_limit=60,
               autoretry_for=(OperationalError,), retry_backoff=1, retry_backoff_max=30, max_retries=6)
def record_probe_report(report: dict) -> None:
    """Store a probe report a worker sent (a ProbeReport as JSON)."""
    parsed = ProbeReport.model_validate(report)
    try:
        environment_probe_record(report=parsed)
    except NotFound:
        # The environment was deleted while its probe ran: nothing left to report on.
        logger.warning("probe %s reported, but it no longer exists", parsed.probe_id)


@platform_task(HEALTH_SWEEP, soft_time_limit=60, time_limit=120)
def health_sweep() -> dict:
    """Expire unanswered probes and request a health probe of every version in use."""
    return environment_health_sweep()
