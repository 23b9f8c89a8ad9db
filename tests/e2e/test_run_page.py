"""The run page in a real Chromium: charts grow live over the WebSocket, without reloading."""

from __future__ import annotations

import re
import time

import httpx
from playwright.sync_api import sync_playwright

CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run",
]


def test_a_run_created_from_the_form_grows_its_charts_live_without_reloading(stack, credentials, tmp_path):
    local, _ = stack
    base = local.config.platform_url
    api = httpx.Client(base_url=base, headers={"Authorization": f"Token {credentials.user_token}"}, timeout=10)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(f"{base}/login/?next=/runs/new/")
        page.fill("#id_username", credentials.username)
        page.fill("#id_password", credentials.password)
        page.click("button[type=submit], input[type=submit]")
        page.wait_for_url("**/runs/new/")
        # The form generated from the run config schema. The synchronous pipeline and the
        # filesystem weight transport, so this run also proves both: every episode comes
        # from the newest policy, loaded from an Orbax checkpoint.
        page.select_option("#id_environment", f"{credentials.project_id}:calculator@1")
        page.fill("#id_name", "browser")
        for field, value in {"sft_steps": "80", "rl_steps": "3", "groups_per_step": "2", "group_size": "4",
                             "groups_per_task": "1"}.items():
            page.fill(f"#id_config_{field}", value)
        page.select_option("#id_config_pipeline", "sync")
        page.select_option("#id_config_weight_transport", "filesystem")
        page.click("#start-run")
        page.wait_for_url(re.compile(r".*/runs/\d+/$"))
        run_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
        config = api.get(f"/api/runs/{run_id}/").json()["config"]
        assert (config["sft_steps"], config["pipeline"], config["weight_transport"]) == (80, "sync", "filesystem")
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
        for chart in ("#chart-reward", "#chart-loss", "#chart-idle"):
            assert page.locator(f"{chart} canvas").count() >= 1, f"{chart} has no chart"
        page.screenshot(path=str(tmp_path / "run_page.png"), full_page=True)
        browser.close()

    assert final_status == "finished"
    assert navigations == [], f"the page reloaded: {navigations}"
    # The count rose in several increments while we watched, not in one load.
    increases = sum(1 for before, after in zip(counts, counts[1:], strict=False) if after > before)
    assert increases >= 3, counts
    assert final_step == 80 + 3
    points = api.get(f"/api/runs/{run_id}/metrics/", params={"after_step": 80, "names": "staleness_max"}).json()
    assert [p["value"] for p in points["points"]] == [0.0, 0.0, 0.0]
    weights = local.config.var_dir / "checkpoints" / "weights" / f"run-{run_id}"
    assert sorted(path.name for path in weights.iterdir()) == ["v1", "v2", "v3"]
