"""Issue 31, point 4: the run page says, live and on load, that the policy stopped calling its tools.

A real uvicorn and Chromium; the run's trainer posts its steps over HTTP with its own client. The
project's default tools_unused rule (3 steps here) fires on the posts, its badge and sentence come
over the socket, go when the policy calls its tools again, and are drawn by the server on a reload.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import sync_playwright

from alerts.models import AlertRule
from tandem.contracts import TrainerStepEvent
from trainer.platform_client import PlatformClient

from .builders import step_event
from .conftest import TRAINER_NAME
from .test_evaluations_live_browser import WAIT_MS, _open_run_page

pytestmark = pytest.mark.django_db(transaction=True)

ALERT = '#run-alerts li[data-kind="tools_unused"]'


def test_the_run_page_shows_the_tools_unused_alert_live_and_drops_it_once_tools_are_called(
    server, running_run, trainer, api
):
    AlertRule.objects.filter(project=running_run.project, kind=AlertRule.Kind.TOOLS_UNUSED).update(steps=3)
    client = PlatformClient(server, trainer.raw_token, trainer_name=TRAINER_NAME)

    def post(step: int, tool_call_rate: float) -> None:
        metrics = {"rollout/calc/tool_call_rate": tool_call_rate, "rollout/calc/latency_p50_s": 1.0}
        client.post_events(running_run.pk, [TrainerStepEvent.model_validate(
            step_event(running_run.pk, step, rollout_metrics=metrics))])

    with sync_playwright() as playwright:
        browser, page, errors = _open_run_page(playwright, server, running_run)
        assert page.is_hidden("#run-alerts")
        for step in (1, 2):
            post(step, 0.0)
        page.wait_for_function("() => window.tandemRunPage.lastStep === 2", timeout=WAIT_MS)
        assert page.is_hidden("#run-alerts")  # two steps without a call, not three

        post(3, 0.0)
        page.wait_for_selector(ALERT, state="visible", timeout=WAIT_MS)
        assert page.inner_text(f"{ALERT} .badge") == "Tools unused"
        assert "called none of environment calc's tools for 3 steps (up to step 3)" in page.inner_text(ALERT)

        post(4, 0.25)  # it calls them again: the alert stops holding
        page.wait_for_selector("#run-alerts", state="hidden", timeout=WAIT_MS)
        assert page.locator(ALERT).count() == 0

        for step in (5, 6, 7):
            post(step, 0.0)
        page.wait_for_selector(ALERT, state="visible", timeout=WAIT_MS)
        assert "(up to step 7)" in page.inner_text(ALERT)

        page.reload()  # drawn by the server this time
        page.wait_for_selector(ALERT, state="visible", timeout=WAIT_MS)
        assert page.locator(ALERT).count() == 1 and "(up to step 7)" in page.inner_text(ALERT)
        browser.close()
    client.close()

    assert [error for error in errors if "navigated" not in error] == []  # the reload is the test's own
    [alert] = api.get(f"/api/runs/{running_run.pk}/").json()["alerts"]
    assert (alert["name"], alert["kind"], alert["active"]) == ("Tools unused", "tools_unused", True)
    assert "(up to step 7)" in alert["text"]
