"""Periodic platform task of run logs; thin: it calls a service."""

from common.tasks import platform_task
from tandem.contracts import DRAIN_RUN_LOGS

from .services import run_logs_drain


# Beat runs it every TANDEM_RUN_LOG_DRAIN_INTERVAL_S.
@platform_task(DRAIN_RUN_LOGS, time_limit=60, soft_time_limit=50)
def drain_run_logs() -> dict[int, int]:
    """Store the log lines the runs' trainers and producers shipped; returns run id -> lines stored."""
    return run_logs_drain()
