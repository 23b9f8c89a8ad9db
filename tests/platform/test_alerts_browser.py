"""Alerts in real Chromium against a real uvicorn: a rule made on the page fires when a run fails,
and the navigation's badge and the notifications page show it until it is read."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from playwright.sync_api import expect, sync_playwright

from runs.models import Run
from runs.services import run_transition
from tandem.contracts import RunStatus
from tests.browser import launch_chromium, log_in

from .test_run_page_browser import REPO_ROOT

pytestmark = pytest.mark.django_db(transaction=True)

SCREENSHOT = REPO_ROOT / "test-artifacts" / "alerts-notifications.png"
REASON = "CheckpointError: the disk is full"


def _fail_run_elsewhere(run_id: int) -> None:
    """Fail the run through its service, on a thread of its own: Playwright's sync API keeps an event
    loop running in the test's thread, where Django refuses ORM calls."""

    def fail() -> None:
        try:
            run_transition(run=Run.objects.get(pk=run_id), to_status=RunStatus.FAILED, reason=REASON)
        finally:
            connection.close()

    thread = threading.Thread(target=fail)
    thread.start()
    thread.join()


def test_a_rule_made_on_the_page_fires_into_the_badge_and_the_notifications_page(server, running_run, project):
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    run_id, project_id = running_run.pk, project.pk
    errors: list[str] = []
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("pageerror", lambda error: errors.append(f"pageerror: {error}"))
        page.on("console", lambda message: errors.append(f"console: {message.text}")
                if message.type == "error" else None)
        log_in(page, server, "/alerts/", username="alice", password="pw")
        expect(page.locator("#notification-badge")).to_have_count(0)

        form = page.locator("#alert-rule-form")
        form.locator("[name=project]").select_option(str(project_id))
        form.locator("[name=name]").fill("Failures")
        form.locator("[name=kind]").select_option("metric_threshold")
        expect(form.locator("[name=metric]")).to_be_visible()
        form.locator("[name=kind]").select_option("run_failed")
        # Only the settings the kind uses are shown (and sent).
        expect(form.locator("[name=metric]")).to_be_hidden()
        form.locator("button[type=submit]").click()
        expect(page.locator("#alert-rule-list")).to_contain_text("Failures")
        expect(page.locator("#alert-rule-list")).to_contain_text("Run failed")

        _fail_run_elsewhere(run_id)
        page.goto(f"{server}/runs/")
        expect(page.locator("#notification-badge")).to_have_text("1")

        page.click("#nav-notifications")
        page.wait_for_url("**/notifications/")
        row = page.locator("#notification-list tr.notification-unread")
        expect(row).to_have_count(1)
        expect(row).to_contain_text(REASON)
        expect(row).to_contain_text("Failures")
        expect(row.locator(f"a[href='/runs/{run_id}/']")).to_have_count(1)
        page.screenshot(path=str(SCREENSHOT), full_page=True)

        row.locator("button.mark-read").click()
        expect(page.locator("#notification-list tr.notification-read")).to_have_count(1)
        expect(page.locator("#notification-badge")).to_have_count(0)
        browser.close()
    assert errors == [], errors
