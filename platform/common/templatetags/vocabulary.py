"""The contracts' vocabularies as the dashboard's scripts read them: ``{% contracts_vocabulary %}``.

base.html renders it once per page as a JSON script (``#tandem-contracts``), which
``tandem/contracts.js`` reads into ``window.tandemContracts``: the scripts take run, episode
and checkpoint statuses and metric names from there, never from a copy of their own.

The templates take them from here too: ``{% episode_vocabulary as episodes %}`` gives episode statuses
and sample purposes (``episodes.statuses.TRUNCATED``, ``episodes.status_choices``), and the filter
``episode_badge`` the badge an episode status shows as.
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
    EVALUATION_METRIC_PREFIX,
    EVALUATION_TOOL_METRICS,
    PROCESS_ROLE_LABELS,
    SAMPLE_PURPOSES,
    TERMINAL_RUN_STATUSES,
    CheckpointExportStatus,
    CheckpointStatus,
    RunStatus,
    TraceStatus,
    episode_status_choices,
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
            "series_prefix": EVALUATION_METRIC_PREFIX,
            "leading": list(EVALUATION_LEADING_METRICS),
            "tools": list(EVALUATION_TOOL_METRICS),
            "dataset": list(DATASET_EVALUATION_METRICS),
            "labels": {name: evaluation_metric_label(name) for name in (
                *EVALUATION_LEADING_METRICS, *EVALUATION_TOOL_METRICS, *DATASET_EVALUATION_METRICS)},
        },
    }


@register.simple_tag
def contracts_vocabulary():
    return json_script(contracts_vocabulary_data(), "tandem-contracts")


#: The badge (tandem.css's ``badge-<name>``) each episode status shows as on the trajectory pages.
EPISODE_STATUS_BADGES = {"ok": "finished", "truncated": "paused", "failed": "failed"}
if set(EPISODE_STATUS_BADGES) != set(EPISODE_STATUSES):
    raise AssertionError("every episode status needs a badge, and only episode statuses have one")


@register.filter
def episode_badge(status: str) -> str:
    return EPISODE_STATUS_BADGES[status]


@register.simple_tag
def episode_vocabulary() -> dict:
    """Episode statuses by name (``statuses.OK``), the statuses' ``(value, label)`` choices, and the sample
    purposes, in a list and by name (``purposes_by_name.EVALUATION``): what a trajectory template compares
    and offers."""
    return {
        "statuses": {status.upper(): status for status in EPISODE_STATUSES},
        "status_choices": episode_status_choices(),
        "purposes": list(SAMPLE_PURPOSES),
        "purposes_by_name": {purpose.upper(): purpose for purpose in SAMPLE_PURPOSES},
    }
