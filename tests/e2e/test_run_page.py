"""The run page in a real Chromium: charts grow live over the WebSocket, without reloading."""

from __future__ import annotations

import io
import re
import time
import zipfile
from pathlib import Path

import httpx
from playwright.sync_api import sync_playwright

from tests.browser import launch_chromium, log_in

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def test_a_run_created_from_the_form_grows_its_charts_live_without_reloading(stack, credentials):
    local, _ = stack
    base = local.config.platform_url
    api = httpx.Client(base_url=base, headers={"Authorization": f"Token {credentials.user_token}"}, timeout=10)

    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        page = browser.new_page()
        log_in(page, base, "/runs/new/", username=credentials.username, password=credentials.password)
        # The form generated from the run config schema. The synchronous pipeline and the
        # filesystem weight transport, so this run also proves both: every episode comes
        # from the newest policy, loaded from an Orbax checkpoint.
        page.select_option("#id_environment", f"{credentials.project_id}:calculator@1")
        page.fill("#id_name", "browser")
        # The rollout and weights sections are folded until opened; the run starts from the review.
        page.click("#config-section-rollout > summary")
        page.click("#config-section-weights > summary")
        for field, value in {"sft_steps": "80", "rl_steps": "3", "rollout__groups_per_step": "2",
                             "rollout__group_size": "4", "rollout__groups_per_task": "1"}.items():
            page.fill(f"#id_config_{field}", value)
        page.select_option("#id_config_rollout__pipeline", "sync")
        page.select_option("#id_config_weights__transport", "filesystem")
        page.click("#review-run")
        page.click("#start-run")
        page.wait_for_url(re.compile(r".*/runs/\d+/$"))
        run_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
        config = api.get(f"/api/runs/{run_id}/").json()["config"]
        assert (config["sft_steps"], config["rollout"]["pipeline"], config["weights"]["transport"]) == (
            80, "sync", "filesystem")
        navigations = []
        page.on("framenavigated", lambda frame: navigations.append(frame.url) if frame == page.main_frame else None)

        counts = []
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            counts.append(page.evaluate("window.tandemRunPage ? window.tandemRunPage.pointCount : 0"))
            if page.inner_text("#run-status").strip() in {"finished", "failed", "cancelled"}:
                break
            time.sleep(0.5)
        final_status = page.inner_text("#run-status").strip()
        final_step = int(page.inner_text("#run-step").strip())
        # A real SFT + RL run feeds every chart of the page.
        chart_points = page.evaluate("window.tandemRunPage.chartPoints")
        for chart in ("chart-reward", "chart-loss", "chart-kl-entropy", "chart-stages", "chart-samples",
                      "chart-tokens", "chart-staleness", "chart-latency", "chart-errors", "chart-tools",
                      "chart-policy"):
            assert page.locator(f"#{chart} canvas").count() == 1, f"{chart} has no chart"
            assert chart_points[chart] > 0, (chart, chart_points)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "run_page_real_run.png"), full_page=True)
        browser.close()

    assert final_status == "finished"
    assert navigations == [], f"the page reloaded: {navigations}"
    # The count rose in several increments while we watched, not in one load.
    increases = sum(1 for before, after in zip(counts, counts[1:], strict=False) if after > before)
    assert increases >= 3, counts
    assert final_step == 80 + 3
    points = api.get(f"/api/runs/{run_id}/metrics/", params={"after_step": 80, "names": "staleness_max"}).json()
    assert [p["value"] for p in points["points"]] == [0.0, 0.0, 0.0]
    # The trainer reports tokens/s at every step, SFT and RL alike.
    tokens = api.get(f"/api/runs/{run_id}/metrics/", params={"names": "tokens_per_s", "limit": 5000}).json()
    assert [p["step"] for p in tokens["points"]] == list(range(1, 80 + 3 + 1))
    assert all(p["value"] > 0 for p in tokens["points"])
    weights = local.config.var_dir / "checkpoints" / "weights" / f"run-{run_id}"
    assert sorted(path.name for path in weights.iterdir()) == ["v1", "v2", "v3"]


def test_a_trace_captured_from_the_run_page_is_listed_and_downloads_as_a_zip_with_an_xplane(
    stack, credentials
):
    local, _ = stack
    base = local.config.platform_url
    api = httpx.Client(base_url=base, headers={"Authorization": f"Token {credentials.user_token}"}, timeout=10)
    # Long enough to still be training when the trace is requested; cancelled once it is captured.
    run_id = api.post("/api/runs/", json={
        "project": credentials.project_id, "name": "traced from the page", "environment": "calculator",
        "config": {"algorithm": {"name": "sft"}, "sft_steps": 5000, "rl_steps": 0},
    }).json()["id"]

    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        page = browser.new_page(viewport={"width": 1280, "height": 900}, accept_downloads=True)
        log_in(page, base, f"/runs/{run_id}/", username=credentials.username, password=credentials.password)
        # Training: steps arrive live (the trainer has claimed it and compiled its step).
        page.wait_for_function("() => window.tandemRunPage && window.tandemRunPage.lastStep >= 1", timeout=300_000)

        page.fill("#trace-steps", "2")
        page.click("#trace-form button[type=submit]")
        page.wait_for_selector("#traces-table tr[data-status=requested]")
        # The trainer takes it at its next steps and uploads it; the list polls until it is in.
        row = page.wait_for_selector("#traces-table tr[data-status=captured]", timeout=180_000)
        assert page.locator("#traces-table tr[data-status=failed]").count() == 0
        with page.expect_download() as download_info:
            row.query_selector("a.trace-download").click()
        archive = Path(download_info.value.path()).read_bytes()
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "run_page_trace.png"), full_page=True)

        page.once("dialog", lambda dialog: dialog.accept())  # "Cancel run ...?": destructive, so it asks
        page.click("#cancel-form button")
        page.wait_for_function("() => document.querySelector('#run-status').textContent === 'cancelled'")
        assert page.is_hidden("#trace-form")  # a cancelled run has no next steps to trace
        browser.close()

    names = zipfile.ZipFile(io.BytesIO(archive)).namelist()
    assert any(name.startswith("plugins/profile/") and name.endswith(".xplane.pb") for name in names), names
    trace = api.get(f"/api/runs/{run_id}/traces/").json()["results"][0]
    assert trace["status"] == "captured" and trace["size_bytes"] == len(archive)
    assert trace["last_step"] - trace["first_step"] + 1 == 2
