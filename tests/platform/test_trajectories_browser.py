"""The trajectory browser in real Chromium against a real uvicorn: the search narrows the list, tokens
are coloured by log-probability with their values on hover, and a group's episodes stand side by side."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import expect, sync_playwright

from tests.browser import launch_chromium, log_in
from trajectories.services import trajectory_samples_record

from .trajectory_builders import calculator_sample

pytestmark = pytest.mark.django_db(transaction=True)

WAIT_MS = 10_000  # bounds every wait on the page's state; none of them is a measurement
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


def _console_errors(message) -> list[str]:
    if message.type != "error" or message.location.get("url", "").endswith("/favicon.ico"):
        return []
    return [f"{message.text} ({message.location.get('url')})"]


def _group_of_four(run_id: int):
    """One GRPO group: three trained episodes with their advantages, and a failed one without."""
    group = f"{run_id}-3"
    return [
        calculator_sample(run_id, step=5, why="group", group_id=group, reward=1.0, advantage=1.15,
                          question="What is 6*7?", expression="6*7", answer="42"),
        calculator_sample(run_id, step=5, why="group", group_id=group, reward=0.5, advantage=0.0),
        calculator_sample(run_id, step=5, why="group", group_id=group, reward=0.0, advantage=-1.15),
        calculator_sample(run_id, step=5, why="group", group_id=group, status="failed"),
    ]


def test_search_colouring_by_logprob_and_the_group_view(server, running_run):
    samples = _group_of_four(running_run.pk)
    trajectory_samples_record(run=running_run, samples=samples)
    best, _, worst, failed = samples
    ARTIFACTS.mkdir(exist_ok=True)

    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on("console", lambda message: errors.extend(_console_errors(message)))
        log_in(page, server, f"/runs/{running_run.pk}/trajectories/", username="alice", password="pw")

        # The search narrows the list to the episode that asked for 6*7.
        rows = page.locator("tr.trajectory-row")
        expect(rows).to_have_count(4, timeout=WAIT_MS)
        page.fill("#trajectory-search", "6*7")
        page.press("#trajectory-search", "Enter")
        expect(rows).to_have_count(1, timeout=WAIT_MS)
        expect(rows.first).to_contain_text(best.trajectory_id[:10])
        page.screenshot(path=str(ARTIFACTS / "trajectories_search.png"), full_page=True)

        # Colouring by log-probability colours the policy's tokens; hovering one shows its values.
        page.goto(f"{server}/runs/{running_run.pk}/trajectories/{best.trajectory_id}/")
        first_policy_token = page.locator(".turn-policy .tok[data-trained]").first
        prompt_token = page.locator(".turn-prompt .tok").first
        assert first_policy_token.evaluate("node => node.style.backgroundColor") == ""
        page.select_option("#token-colouring", "logprob")
        expect(page.locator("#logprob-legend")).to_be_visible(timeout=WAIT_MS)
        # p = exp(-0.5) = 0.607 of the way from red to green: hsl(73, 75%, 80%), by hand (C 0.3, X 0.235,
        # m 0.65) rgb(0.885, 0.95, 0.65) * 255.
        assert first_policy_token.evaluate("node => node.style.backgroundColor") == "rgb(226, 242, 166)"
        assert prompt_token.evaluate("node => node.style.backgroundColor") == ""  # not the policy's
        first_policy_token.hover()
        tooltip = page.locator("#token-tooltip")
        expect(tooltip).to_be_visible(timeout=WAIT_MS)
        expect(tooltip).to_contain_text("logprob -0.500 (p 0.607)")
        expect(tooltip).to_contain_text("advantage 1.150")
        page.screenshot(path=str(ARTIFACTS / "trajectories_logprob_colouring.png"), full_page=True)
        page.select_option("#token-colouring", "advantage")
        assert first_policy_token.evaluate("node => node.style.backgroundColor").startswith("rgba(22, 163, 74")

        # The group view: every episode of the group, each with its reward and advantage.
        page.click("#trajectory-group-link")
        episodes = page.locator("article.group-episode")
        expect(episodes).to_have_count(4, timeout=WAIT_MS)
        shown = [(episodes.nth(index).get_attribute("data-trajectory"),
                  episodes.nth(index).locator(".episode-reward").inner_text(),
                  episodes.nth(index).locator(".episode-advantage").inner_text()) for index in range(4)]
        assert shown == [
            (best.trajectory_id, "1.000", "1.150"), (samples[1].trajectory_id, "0.500", "0.000"),
            (worst.trajectory_id, "0.000", "-1.150"), (failed.trajectory_id, "0.000", "—"),
        ]
        expect(page.locator("#group-coverage")).to_contain_text("4 episodes sampled of the group's 4")
        page.select_option("#token-colouring", "advantage")
        worst_token = episodes.nth(2).locator(".turn-policy .tok[data-trained]").first
        assert worst_token.evaluate("node => node.style.backgroundColor").startswith("rgba(220, 38, 38")
        page.screenshot(path=str(ARTIFACTS / "trajectories_group.png"), full_page=True)
        browser.close()

    assert errors == []
