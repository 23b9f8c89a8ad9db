"""The contracts' vocabularies as the dashboard's scripts read them: ``{% contracts_vocabulary %}``.

base.html renders it once per page as a JSON script (``#tandem-contracts``), which
``tandem/contracts.js`` reads into ``window.tandemContracts``: the scripts take run
statuses and metric names from there, never from a copy of their own.
"""

from __future__ import annotations

from functools import cache

from django import template
from django.utils.html import json_script

from tandem.contracts import (
    ACTIVE_RUN_STATUSES,
    CANCELLABLE_RUN_STATUSES,
    DATASET_EVALUATION_METRICS,
    EVALUATION_LEADING_METRICS,
    TERMINAL_RUN_STATUSES,
    RunStatus,
    evaluation_metric_label,
)

register = template.Library()


@cache
def contracts_vocabulary_data() -> dict:
    """What ``window.tandemContracts`` holds: run statuses (each set in lifecycle order) and evaluation metrics."""
    def ordered(statuses) -> list[str]:
        return [status.value for status in RunStatus if status in statuses]

    return {
        "run_statuses": {
            "all": ordered(RunStatus),
            "active": ordered(ACTIVE_RUN_STATUSES),
            "cancellable": ordered(CANCELLABLE_RUN_STATUSES),
            "terminal": ordered(TERMINAL_RUN_STATUSES),
            # Each status by its name in the contract: a script names one as RUN_STATUSES.by_name.FAILED.
            "by_name": {status.name: status.value for status in RunStatus},
        },
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
