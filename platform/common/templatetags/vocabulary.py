"""The contracts' vocabularies as the dashboard's scripts read them: ``{% contracts_vocabulary %}``.

base.html renders it once per page as a JSON script (``#tandem-contracts``), which
``tandem/contracts.js`` reads into ``window.tandemContracts``: the scripts take run, episode
and checkpoint statuses and metric names from there, never from a copy of their own.
"""

from __future__ import annotations

from enum import StrEnum
from functools import cache

from django import template
from django.utils.html import json_script

from tandem.contracts import (
    ACTIVE_RUN_STATUSES,
    CANCELLABLE_RUN_STATUSES,
    DATASET_EVALUATION_METRICS,
    EPISODE_STATUSES,
    EVALUATION_LEADING_METRICS,
    PROCESS_ROLE_LABELS,
    TERMINAL_RUN_STATUSES,
    CheckpointExportStatus,
    CheckpointStatus,
    RunStatus,
    TraceStatus,
    evaluation_metric_label,
)

register = template.Library()


def _by_name(statuses: type[StrEnum]) -> dict[str, str]:
    return {status.name: status.value for status in statuses}


@cache
def contracts_vocabulary_data() -> dict:
    """What ``window.tandemContracts`` holds: run statuses (each set in lifecycle order), episode and checkpoint
    and trace statuses, process roles' labels, and evaluation metrics. ``by_name``: each status by its name in the contract (a script names one
    as ``run_statuses.by_name.FAILED``)."""
    def ordered(statuses) -> list[str]:
        return [status.value for status in RunStatus if status in statuses]

    return {
        "run_statuses": {
            "all": ordered(RunStatus),
            "active": ordered(ACTIVE_RUN_STATUSES),
            "cancellable": ordered(CANCELLABLE_RUN_STATUSES),
            "terminal": ordered(TERMINAL_RUN_STATUSES),
            "by_name": _by_name(RunStatus),
        },
        "episode_statuses": {"by_name": {status.upper(): status for status in EPISODE_STATUSES}},
        "checkpoint_statuses": {"by_name": _by_name(CheckpointStatus)},
        "checkpoint_export_statuses": {"by_name": _by_name(CheckpointExportStatus)},
        "trace_statuses": {"by_name": _by_name(TraceStatus)},
        "process_roles": {"labels": PROCESS_ROLE_LABELS},
        "evaluation_metrics": {
            "leading": list(EVALUATION_LEADING_METRICS),
            "dataset": list(DATASET_EVALUATION_METRICS),
            "labels": {name: evaluation_metric_label(name)
                       for name in (*EVALUATION_LEADING_METRICS, *DATASET_EVALUATION_METRICS)},
        },
    }


@register.simple_tag
def contracts_vocabulary():
    return json_script(contracts_vocabulary_data(), "tandem-contracts")
