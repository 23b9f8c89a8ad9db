"""The sweeps' periodic task; thin: it calls a service."""

from common.tasks import platform_task
from tandem.contracts import ADVANCE_SWEEPS

from .services import sweeps_advance


# Beat runs it every TANDEM_SWEEP_INTERVAL_S; a pass is a few queries and Optuna calls per running sweep.
@platform_task(ADVANCE_SWEEPS, time_limit=120, soft_time_limit=100)
def advance_sweeps() -> list[int]:
    """Advance every running sweep; returns their ids."""
    return sweeps_advance()
