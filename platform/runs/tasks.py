"""Periodic platform tasks of runs; thin: they call a service."""

from django.conf import settings

from common.tasks import platform_task
from tandem.contracts import FLAG_STALLED_RUNS, REAP_DEAD_TRAINERS

from .services import run_reap_dead_trainers, runs_flag_stalled


# Beat runs it every TANDEM_REAPER_INTERVAL_S; one pass is a few indexed queries.
@platform_task(REAP_DEAD_TRAINERS, time_limit=60, soft_time_limit=50)
def reap_dead_trainers() -> list[int]:
    """Restart (or fail) runs whose trainer stopped sending heartbeats; returns their ids."""
    reaped = run_reap_dead_trainers(heartbeat_timeout_s=settings.TANDEM_TRAINER_HEARTBEAT_TIMEOUT_S)
    return [run.pk for run in reaped]


@platform_task(FLAG_STALLED_RUNS, time_limit=60, soft_time_limit=50)
def flag_stalled_runs() -> list[int]:
    """The progress watchdog: flag running runs whose step stopped advancing; returns their ids."""
    return [run.pk for run in runs_flag_stalled()]
