"""New lines of a run's log, as its open pages learn of them: a compact notice on the run's group.

The page fetches the lines after its cursor over REST (``/api/runs/<id>/logs/``): the
notice carries no line, so a flood of logs costs the socket one small message per drain.
"""

from __future__ import annotations

from runs.realtime import run_broadcast_on_commit


def run_logs_broadcast_on_commit(*, run_id: int, last_line_id: int, lines: int) -> None:
    """Tell the run's open pages that ``lines`` lines were stored, up to ``last_line_id``, once committed."""
    run_broadcast_on_commit(run_id, [{"type": "logs", "run": run_id, "last_id": last_line_id, "lines": lines}])
