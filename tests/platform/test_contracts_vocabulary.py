"""The contracts' vocabularies given to every page's scripts (common/templatetags/vocabulary.py), and the
scripts keeping no copy of their own."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import get_args

import pytest
from django.test import Client

from checkpoints.models import Checkpoint
from runs.services import LEGAL_TRANSITIONS
from tandem.contracts import (
    CANCELLABLE_RUN_STATUSES,
    DATASET_EVALUATION_METRICS,
    EPISODE_STATUSES,
    EVALUATION_LEADING_METRICS,
    EVALUATION_METRICS,
    REWARD_MEAN_METRIC,
    TERMINAL_RUN_STATUSES,
    CheckpointExportStatus,
    CheckpointStatus,
    ProcessRole,
    RunStatus,
    TraceStatus,
    evaluation_metric_label,
)
from telemetry.models import Trace

pytestmark = pytest.mark.django_db

SCRIPTS = Path(__file__).resolve().parents[2] / "frontend" / "static" / "tandem"


def _vocabulary(html: str) -> dict:
    match = re.search(r'<script id="tandem-contracts" type="application/json">(.*?)</script>', html, re.S)
    assert match, "no #tandem-contracts on the page"
    return json.loads(match.group(1))


def test_the_cancellable_statuses_are_those_the_platform_lets_become_cancelled():
    assert {status for status in RunStatus if RunStatus.CANCELLED in LEGAL_TRANSITIONS[status]} \
        == CANCELLABLE_RUN_STATUSES
    assert not CANCELLABLE_RUN_STATUSES & TERMINAL_RUN_STATUSES


@pytest.mark.parametrize("path", ["/runs/", "/devices/", "/evaluations/"])
def test_every_page_carries_the_contracts_vocabulary_and_the_script_that_reads_it(user, path):
    client = Client()
    client.force_login(user)
    html = client.get(path).content.decode()

    vocabulary = _vocabulary(html)
    statuses = vocabulary["run_statuses"]
    assert statuses["all"] == [status.value for status in RunStatus]
    assert set(statuses["cancellable"]) == CANCELLABLE_RUN_STATUSES
    assert set(statuses["terminal"]) == TERMINAL_RUN_STATUSES
    assert statuses["by_name"]["FAILED"] == RunStatus.FAILED
    assert vocabulary["episode_statuses"]["by_name"] == {status.upper(): status for status in EPISODE_STATUSES}
    assert vocabulary["checkpoint_statuses"]["by_name"]["DELETED"] == CheckpointStatus.DELETED
    assert set(vocabulary["checkpoint_export_statuses"]["by_name"].values()) == set(CheckpointExportStatus)
    assert set(vocabulary["trace_statuses"]["by_name"].values()) == set(TraceStatus)
    assert set(vocabulary["process_roles"]["labels"]) == set(get_args(ProcessRole))
    metrics = vocabulary["evaluation_metrics"]
    assert metrics["leading"] == list(EVALUATION_LEADING_METRICS)
    assert metrics["dataset"] == list(DATASET_EVALUATION_METRICS)
    assert metrics["labels"]["success_rate"] == "Success rate"
    assert metrics["labels"]["perplexity"] == "Held-out perplexity"
    if path == "/runs/":  # the run list's reward column names the series it reports
        assert f'title="{REWARD_MEAN_METRIC} of the newest RL step' in html
    # The vocabulary comes before the page's own scripts, which read it as they run.
    assert html.index('id="tandem-contracts"') < html.index("tandem/contracts.js") < html.index("</body>")


def test_the_leading_evaluation_metrics_are_evaluation_metrics_and_labelled():
    assert set(EVALUATION_LEADING_METRICS) <= set(EVALUATION_METRICS)
    assert [evaluation_metric_label(name) for name in EVALUATION_LEADING_METRICS] == ["Success rate", "Mean reward"]
    assert evaluation_metric_label("pass@4") == "pass@4"


def test_the_dashboard_scripts_keep_no_copy_of_the_statuses_or_the_smoothing_or_the_socket_loop():
    scripts = {path.relative_to(SCRIPTS).as_posix(): path.read_text() for path in SCRIPTS.rglob("*.js")}
    statuses = "|".join(status.value for status in RunStatus)
    for name, text in scripts.items():
        # A run status list typed out: two or more statuses in one array or set literal.
        assert not re.search(rf'\[\s*"({statuses})"\s*,\s*"({statuses})"', text), name
        # A status compared with a string typed out, rather than with the vocabulary's by_name.
        assert not re.search(r'status\s*[!=]==?\s*["\']', text), name
        if name != "charts.js":
            assert "function smoothed(" not in text, name
        if name != "socket.js":
            assert "new WebSocket(" not in text, name
    assert "function smoothed(" in scripts["charts.js"] and "new WebSocket(" in scripts["socket.js"]


def test_the_platform_records_checkpoint_and_trace_statuses_in_the_contracts_words():
    assert set(Checkpoint.Status.values) == set(CheckpointStatus)
    assert set(Checkpoint.ExportStatus.values) == set(CheckpointExportStatus)
    assert set(Trace.Status.values) == set(TraceStatus)
