"""Periodic platform tasks of runs; thin: they call a service."""

from celery import shared_task
from django.conf import settings

from .services import run_reap_dead_trainers, runs_flag_stalled


# Beat runs it every TANDEM_REAPER_INTERVAL_S; one pass is a few indexed queries.
# The platform app routes every task to its "platform" queue (CELERY_TASK_DEFAULT_QUEUE).
@shared_task(name="tandem.platform.reap_dead_trainers", time_limit=60, soft_time_limit=50)
def reap_dead_trainers() -> list[int]:
    """Restart (or fail) runs whose trainer stopped sending heartbeats; returns their ids."""
    reaped = run_reap_dead_trainers(heartbeat_timeout_s=settings.TANDEM_TRAINER_HEARTBEAT_TIMEOUT_S)
    return [run.pk for run in reaped]


@shared_task(name="tandem.platform.flag_stalled_runs", time_limit=60, soft_time_limit=50)
def flag_stalled_runs() -> list[int]:
    """The progress watchdog: flag running runs whose step stopped advancing; returns their ids."""
    return [run.pk for run in runs_flag_stalled()]
