"""The run page's Evaluations table and held-out chart, live in real Chromium against a real uvicorn."""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import sync_playwright

from evaluations.services import evaluation_record
from tandem.contracts import TRAINER_HEADER, EvaluationReport
from tests.browser import launch_chromium, log_in

from .conftest import TRAINER_NAME
from .test_evaluations_api import evaluation_report

pytestmark = pytest.mark.django_db(transaction=True)

WAIT_MS = 10_000  # bounds every wait on the page's state; none of them is a measurement
CHART = "chart-evaluation"


def _console_errors(message) -> list[str]:
    """The message, if it is an error of the page's; Chromium's own request for a favicon is not."""
    if message.type != "error" or message.location.get("url", "").endswith("/favicon.ico"):
        return []
    return [f"{message.text} ({message.location.get('url')})"]


def _trainer_poster(server: str, run, trainer):
    """``post(report)``: the run's trainer posts an evaluation report, as it does for real."""
    trainer_http = httpx.Client(
        base_url=server, headers={"Authorization": f"Token {trainer.raw_token}", TRAINER_HEADER: TRAINER_NAME}
    )

    def post(report: dict) -> None:
        response = trainer_http.post(f"/api/trainer/runs/{run.pk}/evaluations/", json=report)
        assert response.status_code in (200, 201), response.text

    return post


def _wait_for(page, condition: str) -> None:
    page.wait_for_function(f"() => {{ const p = window.tandemRunPage; return p && ({condition}); }}",
                           timeout=WAIT_MS)


def _rows(page) -> list[list[str]]:
    return page.eval_on_selector_all(
        "#evaluations-table tbody tr",
        "rows => rows.map(row => [row.dataset.evaluation, row.dataset.kind, row.dataset.environment])",
    )


def _cells(page, index: int, environment: str = "calculator@1") -> list[str]:
    return page.eval_on_selector_all(
        f'#evaluations-table tr[data-evaluation="{index}"][data-environment="{environment}"] td',
        "cells => cells.map(cell => cell.textContent)",
    )


def _headers(page) -> list[str]:
    """The table's metric columns (after #, step, version, environment, status and episodes)."""
    return page.eval_on_selector_all("#evaluations-table th", "cells => cells.map(cell => cell.textContent)")[6:]


def _open_run_page(playwright, server: str, run):
    """The run's page, signed in as alice, once its socket is live; and the list its errors go to."""
    browser = launch_chromium(playwright)
    page = browser.new_page(viewport={"width": 1280, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: errors.extend(_console_errors(message)))
    log_in(page, server, f"/runs/{run.pk}/", username="alice", password="pw")
    page.on("framenavigated", lambda frame: errors.append(f"the page navigated to {frame.url}"))
    page.wait_for_function("() => document.querySelector('#run-connection').textContent === 'live'",
                           timeout=WAIT_MS)
    return browser, page, errors


def test_evaluations_reach_the_open_run_page_without_a_reload(server, running_run, trainer):
    post_evaluation = _trainer_poster(server, running_run, trainer)

    # No ORM calls from here on: Playwright's sync API keeps an event loop running in this thread.
    with sync_playwright() as playwright:
        browser, page, errors = _open_run_page(playwright, server, running_run)
        assert page.locator("#evaluations-table").count() == 0  # no evaluation yet: no table

        # The first evaluation makes the table and the chart's first point.
        post_evaluation(evaluation_report(0, step=10))
        page.wait_for_selector('#evaluations-table tr[data-evaluation="0"]', timeout=WAIT_MS)
        _wait_for(page, f'p.chartSteps["{CHART}"] === 1')
        assert _headers(page) == ["Success rate", "Mean reward", "pass@1", "pass@4"]
        assert _cells(page, 0) == ["0", "10", "5", "calculator@1", "complete", "32",
                                   "0.625 [0.450, 0.770]", "0.500", "0.625", "0.875 [0.530, 0.980]"]
        assert page.locator(f"#{CHART} canvas").count() == 1
        assert page.is_hidden(f'[data-empty-for="{CHART}"]')

        # A second one: a second point, and a column for its new pass@16 ("—" in the first row).
        metrics = {"success_rate": 0.75, "mean_reward": 0.5, "pass@1": 0.75, "pass@4": 0.875, "pass@16": 1.0}
        post_evaluation(evaluation_report(1, step=20, metrics=metrics, intervals={}))
        page.wait_for_selector('#evaluations-table tr[data-evaluation="1"]', timeout=WAIT_MS)
        _wait_for(page, f'p.chartSteps["{CHART}"] === 2')
        assert _headers(page) == ["Success rate", "Mean reward", "pass@1", "pass@4", "pass@16"]
        assert _cells(page, 0)[-1] == "—" and _cells(page, 1)[-1] == "1.000"
        points = page.evaluate(f'window.tandemRunPage.chartPoints["{CHART}"]')

        # A retried post updates its row in place, and its point stays one point.
        post_evaluation(evaluation_report(1, step=20, status="incomplete", reason="run ended", episodes=30,
                                          metrics=metrics, intervals={}))
        page.wait_for_selector('#evaluations-table tr[data-evaluation="1"] .badge-evaluation-incomplete',
                               timeout=WAIT_MS)
        assert _cells(page, 1)[4:6] == ["incomplete run ended", "30"]
        assert _rows(page) == [["0", "environment", "calculator@1"], ["1", "environment", "calculator@1"]]
        assert page.evaluate(f'window.tandemRunPage.chartPoints["{CHART}"]') == points

        # An evaluation recorded while the socket is down arrives by the reconnect's backfill.
        page.evaluate("window.tandemRunPage.socket.close()")
        post_evaluation(evaluation_report(2, step=30))
        _wait_for(page, f'p.reconnects >= 1 && p.chartSteps["{CHART}"] === 3')
        page.wait_for_selector('#evaluations-table tr[data-evaluation="2"]', timeout=WAIT_MS)
        assert _rows(page)[-1] == ["2", "environment", "calculator@1"]

        # A dataset's evaluation at the same point gets a row of its own after the environment's, and
        # columns for its metrics ("—" in the environment's rows).
        dataset_report = evaluation_report(
            2, step=30, kind="dataset", environment="support@1", tasks=40, samples_per_task=1, episodes=40,
            metrics={"loss": 1.25, "perplexity": 3.49, "token_accuracy": 0.5},
            intervals={"loss": [1.0, 1.5]})
        post_evaluation(dataset_report)
        page.wait_for_selector('#evaluations-table tr[data-evaluation="2"][data-kind="dataset"]', timeout=WAIT_MS)
        assert _rows(page) == [["0", "environment", "calculator@1"], ["1", "environment", "calculator@1"],
                               ["2", "environment", "calculator@1"], ["2", "dataset", "support@1"]]
        assert _headers(page) == ["Success rate", "Mean reward", "pass@1", "pass@4", "pass@16",
                                  "Held-out loss", "Held-out perplexity", "Held-out token accuracy"]
        assert _cells(page, 2, "support@1") == ["2", "30", "15", "dataset support@1", "complete", "40",
                                                "—", "—", "—", "—", "—", "1.250 [1.000, 1.500]", "3.490", "0.500"]
        assert _cells(page, 2)[-3:] == ["—", "—", "—"]
        # ... and its loss is charted on the held-out dataset chart, apart from the environment's.
        _wait_for(page, 'p.chartSteps["chart-evaluation-datasets"] === 1')
        assert page.evaluate('window.tandemRunPage.chartSeries["chart-evaluation-datasets"]') == ["support@1"]
        assert page.evaluate(f'window.tandemRunPage.chartSteps["{CHART}"]') == 3

        # One whose environment offers tools: its tool-use columns go after pass@k, before the dataset's.
        tool_use = {"success_rate": 0.5, "mean_reward": 0.5, "tool_call_rate": 0.75, "tool_calls_per_episode": 1.5,
                    "tool_parse_failure_rate": 0.25}
        post_evaluation(evaluation_report(3, step=40, metrics=tool_use, intervals={"tool_call_rate": [0.5, 0.9]}))
        page.wait_for_selector('#evaluations-table tr[data-evaluation="3"]', timeout=WAIT_MS)
        assert _headers(page) == ["Success rate", "Mean reward", "pass@1", "pass@4", "pass@16", "Tool-call rate",
                                  "Tool calls per episode", "Tool-call parse failures", "Held-out loss",
                                  "Held-out perplexity", "Held-out token accuracy"]
        assert _cells(page, 3)[6:] == ["0.500", "0.500", "—", "—", "—", "0.750 [0.500, 0.900]", "1.500", "0.250",
                                       "—", "—", "—"]
        assert _cells(page, 2, "support@1")[-6:] == ["—", "—", "—", "1.250 [1.000, 1.500]", "3.490", "0.500"]
        browser.close()

    assert errors == []  # page errors, console errors and navigations (a reload) alike


def test_a_table_drawn_by_the_server_takes_live_rows_and_columns(server, running_run, trainer):
    evaluation_record(run=running_run, report=EvaluationReport.model_validate(evaluation_report(0, step=10)))
    post_evaluation = _trainer_poster(server, running_run, trainer)

    with sync_playwright() as playwright:
        browser, page, errors = _open_run_page(playwright, server, running_run)
        _wait_for(page, f'p.chartSteps["{CHART}"] === 1')  # from the metrics API
        assert _headers(page) == ["Success rate", "Mean reward", "pass@1", "pass@4"]

        # Its retry, with a pass@16 the page has no column for: the row is replaced, the column added.
        post_evaluation(evaluation_report(0, step=10, status="incomplete", reason="run ended",
                                          metrics={"success_rate": 0.5, "mean_reward": 0.25, "pass@16": 0.75}))
        page.wait_for_selector('#evaluations-table tr[data-evaluation="0"] .badge-evaluation-incomplete',
                               timeout=WAIT_MS)
        assert _headers(page) == ["Success rate", "Mean reward", "pass@1", "pass@4", "pass@16"]
        assert _cells(page, 0) == ["0", "10", "5", "calculator@1", "incomplete run ended", "32",
                                   "0.500 [0.450, 0.770]", "0.250", "—", "—", "0.750"]
        assert _rows(page) == [["0", "environment", "calculator@1"]]
        browser.close()

    assert errors == []
