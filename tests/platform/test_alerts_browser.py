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

from .test_dashboard_fixes_browser import open_page  # noqa: F401 - the browser fixture
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


def test_a_rule_scoped_to_a_run_with_a_cooldown_is_edited_and_disabled_on_the_page_and_the_badge_is_live(
    server, open_page, running_run, project  # noqa: F811
):
    run_id, project_id = running_run.pk, project.pk
    page = open_page(server, "/alerts/")
    page.wait_for_function("window.tandemNotifications && window.tandemNotifications.messages >= 1")

    form = page.locator("#alert-rule-form")
    form.locator("[name=project]").select_option(str(project_id))
    form.locator("[name=name]").fill("This run's failure")
    form.locator("[name=kind]").select_option("run_failed")
    form.locator("[name=run]").fill(str(run_id))
    form.locator("[name=cooldown_minutes]").fill("15")
    form.locator("button[type=submit]").click()
    row = page.locator("#alert-rule-list tr", has_text="This run's failure")
    expect(row.locator(".rule-scope")).to_have_text(f"only run #{run_id}")
    expect(row.locator(".rule-cooldown")).to_contain_text("15")
    expect(row.locator(".rule-last-fired")).to_have_text("never")

    # Edited in a form of its own: the cooldown changes, the rest stays.
    row.locator("a", has_text="Edit").click()
    page.wait_for_url("**/edit/")
    assert page.input_value("[name=run]") == str(run_id)
    page.fill("[name=cooldown_minutes]", "45")
    page.click("#alert-rule-form button[type=submit]")
    page.wait_for_url("**/alerts/")
    expect(row.locator(".rule-cooldown")).to_contain_text("45")
    expect(row.locator(".rule-scope")).to_have_text(f"only run #{run_id}")

    # The badge counts a firing while the page stays open.
    _fail_run_elsewhere(run_id)
    expect(page.locator("#notification-badge")).to_have_text("1")
    page.reload()
    expect(row.locator(".rule-last-fired")).not_to_have_text("never")

    # Disabled and enabled again from the table.
    row.locator(".rule-enabled-form button").click()
    expect(row).to_contain_text("disabled")
    expect(row.locator(".rule-enabled-form button")).to_have_text("Enable")
    row.locator(".rule-enabled-form button").click()
    expect(row.locator(".rule-enabled-form button")).to_have_text("Disable")
