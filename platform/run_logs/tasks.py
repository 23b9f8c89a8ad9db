"""Periodic platform task of run logs; thin: it calls a service."""

from celery import shared_task

from .services import run_logs_drain


# Beat runs it every TANDEM_RUN_LOG_DRAIN_INTERVAL_S; the platform app routes it to its "platform" queue.
@shared_task(name="tandem.platform.drain_run_logs", time_limit=60, soft_time_limit=50)
def drain_run_logs() -> dict[int, int]:
    """Store the log lines the runs' trainers and producers shipped; returns run id -> lines stored."""
    return run_logs_drain()
