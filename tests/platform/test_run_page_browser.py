"""The run page in real Chromium against a real uvicorn: backfill, live points, reconnection."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import sync_playwright

from tandem.contracts import TRAINER_HEADER, TrainerStepEvent
from telemetry.services import metric_events_record
from tests.browser import launch_chromium, log_in

from .builders import step_event
from .conftest import TRAINER_NAME

pytestmark = pytest.mark.django_db(transaction=True)

REPO_ROOT = Path(__file__).resolve().parents[2]


def _charted_per_step_event() -> int:
    """The points of one step event that a chart of the run page draws: what the page counts and backfills."""
    from telemetry.charts import RUN_CHARTS

    names = TrainerStepEvent.model_validate(step_event(1, 1)).metric_values()
    fixed = {series["name"] for chart in RUN_CHARTS for series in chart.get("series", [])}
    fixed |= {chart["share_of"] for chart in RUN_CHARTS if chart.get("share_of")}
    families = [re.compile(chart["family"]["pattern"].replace("(?<", "(?P<")) for chart in RUN_CHARTS if "family" in chart]
    return sum(1 for name in names if name in fixed or any(family.search(name) for family in families))


CHARTED_PER_STEP_EVENT = _charted_per_step_event()


def test_the_run_page_backfills_goes_live_and_misses_nothing_across_a_reconnect(
    server, running_run, user, trainer, tmp_path
):
    history = [
        TrainerStepEvent.model_validate(step_event(running_run.pk, step)) for step in (1, 2, 3)
    ]
    metric_events_record(run=running_run, events=history)
    trainer_http = httpx.Client(
        base_url=server, headers={"Authorization": f"Token {trainer.raw_token}", TRAINER_HEADER: TRAINER_NAME}
    )
    user_http = httpx.Client(base_url=server, headers={"Authorization": f"Token {user.raw_token}"})

    def post_step(step: int) -> None:
        response = trainer_http.post(
            f"/api/trainer/runs/{running_run.pk}/telemetry/",
            json={"events": [step_event(running_run.pk, step)]},
        )
        assert response.status_code == 202, response.text

    def wait_for(page, condition: str) -> None:
        page.wait_for_function(
            f"() => {{ const p = window.tandemRunPage; return p && ({condition}); }}",
            timeout=10_000,
        )

    # No ORM calls from here on: Playwright's sync API keeps an event loop running in this thread.
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        log_in(page, server, f"/runs/{running_run.pk}/", username="alice", password="pw")
        navigations: list[str] = []
        page.on("framenavigated", lambda frame: navigations.append(frame.url))

        # History over REST.
        wait_for(page, f"p.pointCount === {3 * CHARTED_PER_STEP_EVENT} && p.lastStep === 3")
        page.wait_for_function(
            "() => document.querySelector('#run-connection').textContent === 'live'"
        )

        # Live over the WebSocket.
        post_step(4)
        wait_for(page, f"p.lastStep === 4 && p.pointCount === {4 * CHARTED_PER_STEP_EVENT}")
        assert page.inner_text("#run-step") == "4"
        assert page.inner_text("#run-policy-version") == "4"

        # A step posted while the socket is down arrives by the reconnect's backfill, once.
        page.evaluate("window.tandemRunPage.socket.close()")
        post_step(5)
        wait_for(
            page,
            f"p.reconnects >= 1 && p.lastStep === 5 && p.pointCount === {5 * CHARTED_PER_STEP_EVENT}",
        )

        # Status changes arrive live too.
        assert user_http.post(f"/api/runs/{running_run.pk}/cancel/").status_code == 200
        page.wait_for_function(
            "() => document.querySelector('#run-status').textContent === 'cancelled'"
        )
        assert page.locator("#cancel-form").count() == 0
        assert page.is_hidden("#trace-form")  # a cancelled run has no next steps to trace

        # These plain step events carry reward, loss and the policy version (tests/platform/builders.py).
        for chart in ("#chart-reward", "#chart-loss", "#chart-policy"):
            assert page.locator(f"{chart} canvas").count() == 1, chart
        page.screenshot(path=str(tmp_path / "run_page.png"), full_page=True)
        final_count = page.evaluate("window.tandemRunPage.pointCount")
        browser.close()

    assert final_count == 5 * CHARTED_PER_STEP_EVENT
    assert navigations == [], f"the page reloaded: {navigations}"
    assert errors == []
