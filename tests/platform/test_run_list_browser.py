"""The run list as a workspace in real Chromium against a real uvicorn: live new runs, tags, bulk actions."""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import expect, sync_playwright

from tests.browser import launch_chromium, log_in

from .test_run_page_browser import REPO_ROOT

pytestmark = pytest.mark.django_db(transaction=True)

SCREENSHOT = REPO_ROOT / "test-artifacts" / "screenshots" / "run_list_workspace.png"


def test_new_runs_appear_live_tags_are_edited_in_place_and_selected_runs_are_cancelled_or_compared(
    server, make_run, project, environment, user,
):
    alpha = make_run(project, environment=environment, name="alpha")
    beta = make_run(project, environment=environment, name="beta")
    api = httpx.Client(base_url=server, headers={"Authorization": f"Token {user.raw_token}"})
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    # No ORM calls from here on: Playwright's sync API keeps an event loop running in this thread.
    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.on("pageerror", lambda error: errors.append(f"pageerror: {error}"))
        page.on("console", lambda message: errors.append(f"console: {message.text}") if message.type == "error" else None)
        log_in(page, server, "/runs/", username="alice", password="pw")
        navigations: list[str] = []
        page.on("framenavigated", lambda frame: navigations.append(frame.url))

        # A run created through the API shows up without a reload.
        created = api.post("/api/runs/", json={"environment": environment.name, "name": "gamma",
                                              "config": {"sft_steps": 3, "rl_steps": 5}})
        assert created.status_code == 201, created.text
        gamma_id = created.json()["id"]
        gamma = page.locator(f"tr[data-run-id='{gamma_id}']")
        expect(gamma).to_have_count(1, timeout=15_000)
        assert gamma.locator(".run-step").inner_text() == "SFT 0/3 · RL 0/5"
        assert page.locator("#run-table tbody tr").first.get_attribute("data-run-id") == str(gamma_id)  # newest first

        # Tags and notes, edited in place.
        alpha_row = page.locator(f"tr[data-run-id='{alpha.pk}']")
        alpha_row.locator(".run-annotate").click()
        alpha_row.locator(".annotation-editor input[name=tags]").fill("baseline, lr-sweep")
        alpha_row.locator(".annotation-editor textarea[name=notes]").fill("learning rate too high")
        alpha_row.locator(".annotation-editor button[type=submit]").click()
        expect(alpha_row.locator(".annotation-editor")).to_have_count(0)
        assert alpha_row.locator(".run-tags .tag").all_inner_texts() == ["baseline", "lr-sweep"]
        assert api.get(f"/api/runs/{alpha.pk}/").json()["tags"] == ["baseline", "lr-sweep"]
        # The live row of the new run can be edited too.
        gamma.locator(".run-annotate").click()
        gamma.locator(".annotation-editor input[name=tags]").fill("fresh")
        gamma.locator(".annotation-editor button[type=submit]").click()
        expect(gamma.locator(".run-tags .tag")).to_have_text(["fresh"])

        # Bulk cancel asks first: dismissed, nothing changes; accepted, both runs are cancelled.
        page.check(f"tr[data-run-id='{alpha.pk}'] .run-select")
        page.check(f"tr[data-run-id='{beta.pk}'] .run-select")
        expect(page.locator("#bulk-cancel-button")).to_have_text("Cancel selected (2)")
        questions: list[str] = []
        page.once("dialog", lambda dialog: (questions.append(dialog.message), dialog.dismiss()))
        page.click("#bulk-cancel-button")
        assert len(questions) == 1 and f"#{alpha.pk}" in questions[0] and f"#{beta.pk}" in questions[0]
        assert api.get(f"/api/runs/{alpha.pk}/").json()["status"] == "queued"
        page.once("dialog", lambda dialog: (questions.append(dialog.message), dialog.accept()))
        page.click("#bulk-cancel-button")
        expect(page.locator("#bulk-message")).to_have_text("Cancelled 2 runs.")
        for run_id in (alpha.pk, beta.pk):
            expect(page.locator(f"tr[data-run-id='{run_id}'] .run-status .badge")).to_have_text("cancelled")
            assert api.get(f"/api/runs/{run_id}/").json()["status"] == "cancelled"
        assert api.get(f"/api/runs/{gamma_id}/").json()["status"] == "queued"
        assert navigations == []
        page.screenshot(path=str(SCREENSHOT), full_page=True)

        # Bulk compare opens the compare page with the ticked runs.
        page.uncheck(f"tr[data-run-id='{beta.pk}'] .run-select")
        page.check(f"tr[data-run-id='{gamma_id}'] .run-select")
        page.click("#compare-button")
        page.wait_for_url(f"**/runs/compare/?runs={gamma_id},{alpha.pk}")
        browser.close()
    api.close()
    assert errors == [], errors
