"""The timeline page of a real run in a real Chromium: it follows the run while it trains and ends up
drawing every step's stages and every episode the trainer consumed.

The screenshot goes to test-artifacts/timeline_e2e.png (gitignored), for people to look at.
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import sync_playwright

from tests.browser import launch_chromium, log_in
from tests.e2e.conftest import example_http_environment, register_http_environment

# Synchronous against an environment whose every step takes 1 s, so each of the 12 RL steps waits
# at least that long for its episodes: the run lasts several of the page's 3 s polls whatever the
# machine's speed, and the test sees it grow. (On the in-process calculator, once nothing compiled
# mid-run, the steps after the first all landed between two polls.)
RUN = {"sft_steps": 0, "rl_steps": 12,
       "rollout": {"groups_per_step": 2, "group_size": 4, "groups_per_task": 1, "pipeline": "sync"}}
STEP_LATENCY_MS = 1000
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


@pytest.fixture
def one_second_environment_url():
    with example_http_environment(latency_ms=STEP_LATENCY_MS) as url:
        yield url


def test_the_timeline_of_a_real_run_draws_every_step_and_episode(stack, credentials, one_second_environment_url):
    local, _ = stack
    base = local.config.platform_url
    api = httpx.Client(base_url=base, headers={"Authorization": f"Token {credentials.user_token}"}, timeout=10)
    register_http_environment(api, project_id=credentials.project_id, name="timeline-remote",
                              url=one_second_environment_url)
    created = api.post("/api/runs/", json={"project": credentials.project_id, "name": "timeline",
                                           "environment": "timeline-remote", "config": RUN})
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]
    steps = RUN["sft_steps"] + RUN["rl_steps"]

    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        errors = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        log_in(page, base, f"/runs/{run_id}/timeline/", username=credentials.username,
               password=credentials.password)
        # Opened before the trainer's first step: everything it shows came by polling.
        seen = []
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            drawn = page.evaluate("() => ({...window.tandemTimeline})")
            seen.append(drawn["steps"])
            if drawn["status"] not in {"queued", "starting", "running"} and drawn["steps"] == steps:
                break
            time.sleep(0.5)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "timeline_e2e.png"), full_page=True)
        browser.close()

    assert errors == [], errors
    assert drawn["status"] == "finished", drawn
    assert len({count for count in seen if 0 < count < steps}) >= 2, seen  # it grew while we watched
    timeline = api.get(f"/api/runs/{run_id}/timeline/").json()
    episodes = [e for step in timeline["steps"] for e in step["episodes"]]
    assert len(episodes) >= RUN["rl_steps"] * RUN["rollout"]["groups_per_step"] * RUN["rollout"]["group_size"]
    assert drawn["stageSegments"] == sum(len(step["stages"]) for step in timeline["steps"])
    assert drawn["idleSegments"] >= RUN["rl_steps"]
    assert drawn["episodeBars"] + drawn["episodesBeforeWindow"] == len(episodes)
    assert drawn["failedBars"] == sum(e["status"] == "failed" for e in episodes
                                      if e["finished_at"] >= timeline["started_at"])
