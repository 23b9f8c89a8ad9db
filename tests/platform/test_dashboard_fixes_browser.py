"""The dashboard's broken bits of issue 18, each shown fixed in real Chromium against a real uvicorn.

Destructive actions ask first (with JavaScript and without), charts draw constant series and
single points, the timeline's labels fit, the devices page fits 800 px, an ended run's page says
it ended and offers no trace, an SFT checkpoint has no "policy version -1", and every page has a
favicon. Any page error or console error fails the test. Screenshots go to
test-artifacts/screenshots/.
"""

from __future__ import annotations

import time

import httpx
import pytest
from playwright.sync_api import sync_playwright

from accounts.services import api_token_create
from checkpoints.services import checkpoints_report
from runs.services import run_transition
from tandem.contracts import CheckpointInfo, CheckpointReport, TrainerStepEvent
from telemetry.services import metric_events_record
from tests.browser import launch_chromium, log_in
from trainer.platform_client import PlatformClient

from .builders import device_report, episode_span, step_event, timeline_event
from .conftest import TRAINER_NAME
from .test_run_page_browser import REPO_ROOT

pytestmark = pytest.mark.django_db(transaction=True)

SCREENSHOTS = REPO_ROOT / "test-artifacts" / "screenshots"


@pytest.fixture
def open_page():
    """``open_page(server, next_path, width=1280, javascript=True)``: a signed-in page.

    Its page errors and console errors fail the test. Chromium starts at the first page,
    after the test's database set-up (Playwright's sync API keeps an event loop running).
    """
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    started: dict = {}
    contexts: list = []

    def open_(base: str, next_path: str, *, width: int = 1280, javascript: bool = True):
        if not started:
            started["playwright"] = sync_playwright().start()
            started["browser"] = launch_chromium(started["playwright"])
        context = started["browser"].new_context(viewport={"width": width, "height": 900},
                                                 java_script_enabled=javascript)
        contexts.append(context)
        page = context.new_page()
        page.on("pageerror", lambda error: errors.append(f"pageerror: {error}"))
        page.on("console", lambda message: errors.append(f"console: {message.text}")
                if message.type == "error" else None)
        log_in(page, base, next_path, username="alice", password="pw")
        return page

    yield open_
    # Pages closed before the browser: their WebSockets end cleanly, and uvicorn stops promptly.
    for context in contexts:
        context.close()
    if started:
        started["browser"].close()
        started["playwright"].stop()
    assert errors == [], errors


def _status(server: str, user, run_id: int) -> str:
    api = httpx.Client(base_url=server, headers={"Authorization": f"Token {user.raw_token}"})
    return api.get(f"/api/runs/{run_id}/").json()["status"]


def test_cancel_run_asks_first_and_a_declined_dialog_changes_nothing(server, open_page, running_run, user):
    page = open_page(server, f"/runs/{running_run.pk}/")
    questions: list[str] = []

    def decline(dialog):
        questions.append(dialog.message)
        dialog.dismiss()

    page.once("dialog", decline)
    page.click("#cancel-form button")
    assert questions and "Cancel run" in questions[0] and "cannot be resumed" in questions[0]
    assert _status(server, user, running_run.pk) == "running"
    assert page.url.endswith(f"/runs/{running_run.pk}/")

    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#cancel-form button")
    page.wait_for_selector("#run-status.badge-cancelled")
    assert _status(server, user, running_run.pk) == "cancelled"
    assert "cancelled" in page.inner_text(".messages")


def test_cancel_run_and_revoke_token_ask_on_a_page_of_their_own_without_javascript(
    server, open_page, running_run, user
):
    spare, raw = api_token_create(user=user, name="spare")

    page = open_page(server, f"/runs/{running_run.pk}/", javascript=False)
    page.click("#cancel-form button")
    page.wait_for_selector("#confirmation")
    assert "Cancel run" in page.inner_text("#confirmation h1")
    assert _status(server, user, running_run.pk) == "running"  # asking changed nothing
    page.screenshot(path=str(SCREENSHOTS / "confirm_cancel_without_javascript.png"), full_page=True)
    page.click("#confirmation-back")
    page.wait_for_url(f"**/runs/{running_run.pk}/")
    assert _status(server, user, running_run.pk) == "running"
    page.click("#cancel-form button")
    page.click("#confirmation-form button[type=submit]")
    page.wait_for_url(f"**/runs/{running_run.pk}/")
    assert _status(server, user, running_run.pk) == "cancelled"

    page.goto(f"{server}/tokens/")
    page.click(f"form[action='/tokens/{spare.pk}/revoke/'] button")
    page.wait_for_selector("#confirmation")
    assert page.inner_text("#confirmation h1") == "Revoke token 'spare'?"
    assert httpx.get(f"{server}/api/runs/", headers={"Authorization": f"Token {raw}"}).status_code == 200
    page.click("#confirmation-form button[type=submit]")
    page.wait_for_url("**/tokens/")
    assert "revoked" in page.inner_text(".messages")
    assert httpx.get(f"{server}/api/runs/", headers={"Authorization": f"Token {raw}"}).status_code == 401


def test_revoke_token_asks_first_with_javascript(server, open_page, user):
    spare, raw = api_token_create(user=user, name="spare")
    revoke = f"form[action='/tokens/{spare.pk}/revoke/'] button"

    page = open_page(server, "/tokens/")
    page.once("dialog", lambda dialog: dialog.dismiss())
    page.click(revoke)
    assert page.locator(revoke).count() == 1
    assert httpx.get(f"{server}/api/runs/", headers={"Authorization": f"Token {raw}"}).status_code == 200
    page.once("dialog", lambda dialog: dialog.accept())
    page.click(revoke)
    page.wait_for_selector(".messages")
    assert "Token 'spare' revoked." in page.inner_text(".messages")
    assert page.locator(revoke).count() == 0


def test_a_constant_series_gets_a_range_around_it_and_a_single_point_is_drawn(
    server, open_page, make_run, project, environment
):
    flat = make_run(project, environment=environment, name="flat")
    single = make_run(project, environment=environment, name="single")
    metric_events_record(run=flat, events=[TrainerStepEvent.model_validate(
        step_event(flat.pk, step, reward_mean=0.0, success_rate=0.0, loss=2.5)) for step in (1, 2, 3)])
    metric_events_record(run=single, events=[TrainerStepEvent.model_validate(
        step_event(single.pk, 1, reward_mean=0.75, success_rate=0.5, loss=0.5))])

    page = open_page(server, f"/runs/{flat.pk}/")
    page.wait_for_function("() => ['chart-reward', 'chart-loss'].every("
                           "(id) => window.tandemRunPage.chartYRange[id] !== undefined)")
    ranges = page.evaluate("({...window.tandemRunPage.chartYRange})")
    low, high = ranges["chart-reward"]
    assert low < 0 < high and high <= 1  # around zero, not 0 to 100
    low, high = ranges["chart-loss"]
    assert low < 2.5 < high and high - low <= 1
    page.screenshot(path=str(SCREENSHOTS / "run_constant_series.png"), full_page=True)

    page.goto(f"{server}/runs/{single.pk}/")
    page.wait_for_function("() => window.tandemRunPage.chartSteps['chart-reward'] === 1")
    # The reward's blue is on the canvas: its one point is drawn.
    assert _canvas_has_colour(page, "#chart-reward canvas", (37, 99, 235))
    page.locator("#chart-reward-card").screenshot(path=str(SCREENSHOTS / "run_single_point.png"))

    page.goto(f"{server}/runs/compare/?runs={flat.pk},{single.pk}")
    page.wait_for_function("() => window.tandemCompare && window.tandemCompare.charts === 3")
    low, high = page.evaluate("window.tandemCompare.yRanges.loss")
    assert low < 0.5 and high > 2.5 and high < 100
    # The single run's one point of each metric is drawn, in its colour (the second of the palette).
    assert _canvas_has_colour(page, "#compare-reward_mean canvas", (220, 38, 38))
    page.screenshot(path=str(SCREENSHOTS / "run_compare_single_point.png"), full_page=True)


def _canvas_has_colour(page, selector: str, rgb: tuple[int, int, int]) -> bool:
    return page.evaluate(
        """([selector, rgb]) => {
            const canvas = document.querySelector(selector);
            const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
            for (let i = 0; i < data.length; i += 4) {
                if (Math.abs(data[i] - rgb[0]) < 8 && Math.abs(data[i + 1] - rgb[1]) < 8
                    && Math.abs(data[i + 2] - rgb[2]) < 8 && data[i + 3] > 200) return true;
            }
            return false;
        }""",
        [selector, list(rgb)],
    )


def test_the_timeline_labels_a_four_digit_episode_count_whole(server, open_page, running_run, trainer):
    start = time.time() - 30
    # 840 episodes a step (a step holds at most 1,000): 1,680 in all.
    events = [TrainerStepEvent.model_validate(timeline_event(
        running_run.pk, step, started_at=start + 3 * step, episodes=[
            episode_span(f"s{step}g{index // 8}", index % 8, started_at=start + 3 * step + 0.001 * index, seconds=0.5)
            for index in range(840)])) for step in (1, 2)]
    client = PlatformClient(server, trainer.raw_token, trainer_name=TRAINER_NAME)
    client.post_events(running_run.pk, events)
    client.close()

    page = open_page(server, f"/runs/{running_run.pk}/timeline/")
    page.wait_for_function("() => window.tandemTimeline && window.tandemTimeline.steps === 2")
    assert page.evaluate("window.tandemTimeline.episodeBars") == 1680
    gutter = page.evaluate("window.tandemTimeline.gutter")
    texts = [label["text"] for label in gutter]
    assert "1,680" in texts
    assert all(label["left"] >= 0 for label in gutter), gutter  # nothing cut at the canvas's left edge
    page.screenshot(path=str(SCREENSHOTS / "timeline_episode_count.png"), full_page=True)


def test_the_devices_page_fits_800_pixels(server, open_page, running_run, trainer):
    client = PlatformClient(server, trainer.raw_token, trainer_name=TRAINER_NAME)
    client.post_events(running_run.pk, [TrainerStepEvent.model_validate(
        step_event(running_run.pk, 1, device=device_report()))])
    client.close()

    page = open_page(server, "/devices/", width=800)
    page.wait_for_selector(".device-row")
    overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
    page.screenshot(path=str(SCREENSHOTS / "devices_800px.png"), full_page=True)
    assert overflow <= 0


def test_an_ended_run_says_so_and_offers_no_trace(server, open_page, make_run, project, environment, running_run,
                                                  user):
    failed = make_run(project, environment=environment, name="broken")
    run_transition(run=failed, to_status="failed", reason="trainer error: CheckpointError: disk full")

    page = open_page(server, f"/runs/{failed.pk}/")
    page.wait_for_function("() => window.tandemRunPage && window.tandemRunPage.socket !== null")
    assert page.inner_text("#run-connection") == "none, the run has ended (failed)"
    assert page.locator("#trace-form").count() == 0 or page.is_hidden("#trace-form")
    page.screenshot(path=str(SCREENSHOTS / "run_failed.png"), full_page=True)

    # A run that ends while the page is open says so at once.
    page.goto(f"{server}/runs/{running_run.pk}/")
    page.wait_for_function("() => document.querySelector('#run-connection').textContent === 'live'")
    assert page.is_visible("#trace-form")
    cancelled = httpx.post(f"{server}/api/runs/{running_run.pk}/cancel/",
                           headers={"Authorization": f"Token {user.raw_token}"})
    assert cancelled.status_code == 200
    page.wait_for_function("() => document.querySelector('#run-status').textContent === 'cancelled'")
    assert page.inner_text("#run-connection") == "none, the run has ended (cancelled)"
    assert page.is_hidden("#trace-form")


def test_an_sft_checkpoint_has_no_policy_version_and_every_page_has_a_favicon(
    server, open_page, running_run, tmp_path
):
    checkpoints_report(run=running_run, report=CheckpointReport(checkpoints=[
        CheckpointInfo(step=step, policy_version=version, path=str(tmp_path / str(step)), size_bytes=1)
        for step, version in ((20, -1), (40, 3))]))

    page = open_page(server, f"/runs/{running_run.pk}/")
    page.wait_for_selector("#checkpoints-table tr[data-step='20']")
    versions = {
        step: page.locator(f"#checkpoints-table tr[data-step='{step}'] td").nth(1).inner_text()
        for step in (20, 40)
    }
    assert versions == {20: "none yet (SFT)", 40: "3"}
    favicon = page.get_attribute("link[rel=icon]", "href")
    assert favicon.endswith(".svg")
    answer = httpx.get(f"{server}{favicon}")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("image/svg+xml")
