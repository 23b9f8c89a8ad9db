"""The evaluations page: every evaluation of the user's projects, sorted by any metric, compared, as CSV."""

from __future__ import annotations

import csv
import io

import pytest
from django.test import Client
from playwright.sync_api import expect

from evaluations.services import evaluation_record
from tandem.contracts import EvaluationReport

from .test_dashboard_browser import chromium_page  # noqa: F401 - the fixture
from .test_evaluations_api import evaluation_report


def _evaluated(make_run, project, environment, *, name: str, success: float, pass4: float | None = None):
    run = make_run(project, environment=environment, name=name)
    metrics = {"success_rate": success, "mean_reward": success / 2, "pass@1": success}
    if pass4 is not None:
        metrics["pass@4"] = pass4
    report = evaluation_report(metrics=metrics, intervals={"success_rate": [success - 0.1, success + 0.1]})
    evaluation, _ = evaluation_record(run=run, report=EvaluationReport.model_validate(report))
    return evaluation


@pytest.fixture
def evaluations(make_run, make_project, make_environment, make_user, project, environment):
    mine = [_evaluated(make_run, project, environment, name=name, success=success, pass4=pass4)
            for name, success, pass4 in (("baseline", 0.25, 0.5), ("=HYPERLINK(1)", 0.75, None), ("tuned", 0.5, 0.9))]
    stranger = make_project(owner=make_user("mallory"))
    _evaluated(make_run, stranger, make_environment(stranger), name="not-alices", success=0.99)
    return mine


def _page(user, query: str = ""):
    client = Client()
    client.force_login(user)
    return client.get(f"/evaluations/{query}")


def test_the_page_lists_the_users_evaluations_sorted_by_a_metric(user, evaluations):
    page = _page(user, "?sort=success_rate&order=desc").content.decode()
    assert "not-alices" not in page
    order = [page.index(name) for name in ("=HYPERLINK(1) v10", "tuned v10", "baseline v10")]
    assert order == sorted(order)
    ascending = _page(user, "?sort=success_rate&order=asc").content.decode()
    assert ascending.index("baseline v10") < ascending.index("tuned v10")
    # A row without the metric sorts last either way.
    by_pass4 = _page(user, "?sort=pass@4&order=asc").content.decode()
    assert by_pass4.index("baseline v10") < by_pass4.index("tuned v10") < by_pass4.index("=HYPERLINK(1) v10")
    assert "[0.150, 0.350]" in page  # baseline's interval


def test_tool_use_columns_come_after_pass_at_k_once_an_environment_offers_tools(user, evaluations, make_run,
                                                                                 project, environment):
    plain = _page(user).content.decode()
    assert 'data-sort="tool_call_rate"' not in plain
    run = make_run(project, environment=environment, name="with-tools")
    metrics = {"success_rate": 0.5, "mean_reward": 0.5, "tool_call_rate": 0.875, "tool_calls_per_episode": 2.0,
               "tool_parse_failure_rate": 0.125, "pass@4": 0.75}
    evaluation_record(run=run, report=EvaluationReport.model_validate(evaluation_report(
        metrics=metrics, intervals={"tool_call_rate": [0.7, 0.95]})))

    page = _page(user, "?sort=tool_call_rate&order=desc").content.decode()
    headers = [page.index(f'data-sort="{name}"') for name in (
        "mean_reward", "pass@4", "tool_call_rate", "tool_calls_per_episode", "tool_parse_failure_rate")]
    assert headers == sorted(headers)
    assert "[0.700, 0.950]" in page
    # Sorted by the tool-call rate: the run with tools first, the rows without it after.
    assert page.index("with-tools v10") < page.index("baseline v10")


def test_ticked_rows_are_compared_side_by_side(user, evaluations):
    baseline, _, tuned = evaluations
    page = _page(user, f"?compare={baseline.pk}&compare={tuned.pk}").content.decode()
    comparison = page[page.index('id="evaluation-comparison"'):page.index('id="evaluation-list"')]
    # Columns in the table's order: newest first by default.
    assert comparison.index("tuned v10") < comparison.index("baseline v10")
    assert "=HYPERLINK(1) v10" not in comparison
    assert 'data-metric="pass@4"' in comparison and "0.900" in comparison and "0.500" in comparison
    assert 'id="evaluation-comparison"' not in _page(user, f"?compare={baseline.pk}").content.decode()


def test_the_csv_holds_the_table_with_its_intervals_and_no_formulas(user, evaluations):
    client = Client()
    client.force_login(user)
    response = client.get("/evaluations.csv?sort=success_rate&order=asc")
    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert [row["run_name"] for row in rows] == ["baseline", "tuned", "'=HYPERLINK(1)"]
    assert rows[0]["success_rate"] == "0.25" and rows[0]["success_rate_low"] == "0.15"
    assert rows[1]["pass@4"] == "0.9" and rows[2]["pass@4"] == ""
    assert "not-alices" not in response.content.decode()


@pytest.mark.django_db(transaction=True)
def test_the_page_in_a_browser_sorts_and_compares(server, chromium_page, user, evaluations):  # noqa: F811
    baseline, _, tuned = evaluations
    # No ORM calls from here on: Playwright's sync API keeps an event loop running in this thread.
    page = chromium_page(server, "/evaluations/")
    rows = page.locator(".evaluation-row")
    expect(rows).to_have_count(3)
    page.click("a.sort[data-sort='success_rate']")
    page.wait_for_url("**sort=success_rate**")
    assert rows.evaluate_all("rows => rows.map(row => row.dataset.evaluationId)") == [
        str(evaluations[1].pk), str(tuned.pk), str(baseline.pk)]
    page.check(f"input[name=compare][value='{baseline.pk}']")
    page.check(f"input[name=compare][value='{tuned.pk}']")
    page.click("#compare-selected")
    expect(page.locator("#evaluation-comparison .compared-policy")).to_have_count(2)
