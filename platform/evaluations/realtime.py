"""An evaluation as the run page's open tabs learn of it: a compact delta on the run's group.

The page upserts the evaluation's table row by (index, kind, environment) and charts the
metrics of the run's environment (a dataset's are series of their own). Sending is best
effort, as for the trainer's step metrics (runs.realtime): a tab whose socket was down
gets the evaluations over REST when it reconnects, and any tab on its next load.
"""

from __future__ import annotations

from runs.realtime import run_broadcast_on_commit

from .models import Evaluation
from .series import evaluation_series_label


def evaluation_message(evaluation: Evaluation) -> dict:
    """What a tab needs to draw the evaluation's row and chart points; never its trajectory ids
    (up to 100,000 of them)."""
    return {
        "type": "evaluation",
        "run": evaluation.run_id,
        "index": evaluation.index,
        "step": evaluation.step,
        "policy_version": evaluation.policy_version,
        "kind": evaluation.kind,
        "environment": evaluation.environment,
        "series_label": evaluation_series_label(kind=evaluation.kind, label=evaluation.environment),
        "status": evaluation.status,
        "reason": evaluation.reason,
        "episodes": evaluation.episodes,
        "metrics": evaluation.metrics,
        "intervals": evaluation.intervals,
    }


def evaluation_broadcast_on_commit(evaluation: Evaluation) -> None:
    """Tell the run's open pages about the evaluation, new or updated, once the transaction commits."""
    run_broadcast_on_commit(evaluation.run_id, [evaluation_message(evaluation)])
