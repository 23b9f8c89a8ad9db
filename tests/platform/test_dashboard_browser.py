"""The dashboard's pages in real Chromium against a real uvicorn: trajectories, run actions, the run list.

Screenshots of every page go to test-artifacts/screenshots/ (gitignored), for people to look at.
"""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import sync_playwright

from runs.services import run_transition
from tandem.contracts import EvaluationReport, TrainerStepEvent
from telemetry.services import metric_events_record
from tests.browser import launch_chromium, log_in
from trainer.platform_client import PlatformClient
from trainer.trajectory_samples import TrajectorySampleBuffer

from .builders import full_rl_step_event, step_event
from .conftest import TRAINER_NAME
from .test_run_page_browser import REPO_ROOT
from .trajectory_builders import CALC, TOKENIZER, calculator_record, chat_calculator_record

pytestmark = pytest.mark.django_db(transaction=True)

SCREENSHOTS = REPO_ROOT / "test-artifacts" / "screenshots"
# How long a live update may take to reach the page on a loaded machine (two suites side by side).
LOADED_MS = 60_000
RUN_CHARTS = ("chart-reward", "chart-loss", "chart-kl-entropy", "chart-stages", "chart-samples", "chart-tokens",
              "chart-staleness", "chart-latency", "chart-errors", "chart-tools", "chart-policy")


@pytest.fixture
def chromium_page():
    """``open_page(server, next_path)``: a logged-in page; errors of its scripts fail the test.

    Chromium starts at the first page, after the test's own database set-up: Playwright's
    sync API keeps an event loop running in this thread, and Django refuses ORM calls then.
    """
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    started: dict = {}

    def open_page(base: str, next_path: str, *, username: str = "alice"):
        if not started:
            started["playwright"] = sync_playwright().start()
            started["browser"] = launch_chromium(started["playwright"])
        page = started["browser"].new_page(viewport={"width": 1280, "height": 900})
        page.on("pageerror", lambda error: errors.append(str(error)))
        log_in(page, base, next_path, username=username, password="pw")
        return page

    yield open_page
    if started:
        started["browser"].close()
        started["playwright"].stop()
    assert errors == [], errors


def test_a_posted_trajectory_shows_its_turns_tool_call_and_trained_tokens(
    server, chromium_page, running_run, trainer
):
    records = [
        calculator_record(running_run.pk, reward=1.0),
        calculator_record(running_run.pk, reward=0.0, answer="6"),
        calculator_record(running_run.pk, status="failed"),
    ]
    # Sent as the trainer sends them: its sample buffer, through its platform client, over HTTP.
    client = PlatformClient(server, trainer.raw_token, trainer_name=TRAINER_NAME)
    buffer = TrajectorySampleBuffer(client, running_run.pk, TOKENIZER, per_step=2, tools=[CALC])
    buffer.add_step(step=3, records=records)
    buffer.flush()
    client.close()
    assert (buffer.posted, buffer.lost) == (3, 0)
    best, failed = records[0], records[2]

    # No ORM calls from here on: Playwright's sync API keeps an event loop running in this thread.
    page = chromium_page(server, f"/runs/{running_run.pk}/")
    page.click("#trajectories-link")
    page.wait_for_url(f"**/runs/{running_run.pk}/trajectories/")
    assert page.locator(".trajectory-row").count() == 3
    page.screenshot(path=str(SCREENSHOTS / "trajectory_list.png"), full_page=True)

    page.select_option("select[name=status]", "failed")
    page.click("#trajectory-filters button[type=submit]")
    page.wait_for_url("**status=failed**")
    assert page.locator(".trajectory-row").count() == 1
    assert "tool calc timed out" in page.inner_text("#trajectory-table")
    page.select_option("select[name=status]", "")
    page.fill("input[name=min_reward]", "0.5")
    page.click("#trajectory-filters button[type=submit]")
    page.wait_for_url("**min_reward=0.5**")
    assert page.locator(".trajectory-row").count() == 1

    page.click(f"a[href$='/trajectories/{best.trajectory_id}/']")
    page.wait_for_url(f"**/trajectories/{best.trajectory_id}/")
    roles = page.locator("#turns > li").evaluate_all("items => items.map(item => item.dataset.role)")
    assert roles == ["prompt", "policy", "tool", "policy"]
    assert page.inner_text("#trajectory-policy-versions") == "v3, v4"
    trained = page.locator("#turns .span-trained").all_inner_texts()
    masked = page.locator("#turns .span-masked").all_inner_texts()
    assert trained == ["calc(2+3)⟨eos⟩", "5⟨eos⟩"]
    assert masked == ["⟨bos⟩tools:calc\nWhat is 2+3?", "5"]
    assert "calc(expression=2+3)" in page.inner_text(".turn-policy .tool-call")
    # The two kinds of span look different, and the legend says which is which.
    colours = page.evaluate(
        "() => ['.span-trained', '.span-masked'].map(s => getComputedStyle(document.querySelector("
        "'#turns ' + s)).backgroundColor)"
    )
    assert colours[0] != colours[1]
    assert "trained" in page.inner_text("#mask-legend") and "masked" in page.inner_text("#mask-legend")
    page.screenshot(path=str(SCREENSHOTS / "trajectory_detail.png"), full_page=True)

    page.goto(f"{server}/runs/{running_run.pk}/trajectories/{failed.trajectory_id}/")
    assert "tool calc timed out after 30s" in page.inner_text("#trajectory-failure")
    assert page.locator("#turns .span-trained").count() == 0
    page.screenshot(path=str(SCREENSHOTS / "trajectory_failed.png"), full_page=True)


def test_a_chat_template_trajectory_shows_role_tagged_messages_and_its_tokens_folded(
    server, chromium_page, running_run, trainer, smollm2
):
    from policy import load_tokenizer

    tokenizer = load_tokenizer(str(smollm2))
    record = chat_calculator_record(running_run.pk, tokenizer, status="truncated",
                                    reason="reached max_turns=2 before the environment ended the episode")
    client = PlatformClient(server, trainer.raw_token, trainer_name=TRAINER_NAME)
    buffer = TrajectorySampleBuffer(client, running_run.pk, tokenizer, per_step=2, tools=[CALC])
    buffer.add_step(step=4, records=[record])
    buffer.flush()
    client.close()
    assert (buffer.posted, buffer.lost) == (1, 0)

    page = chromium_page(server, f"/runs/{running_run.pk}/trajectories/?status=truncated")
    assert page.locator(".trajectory-row").count() == 1
    page.goto(f"{server}/runs/{running_run.pk}/trajectories/{record.trajectory_id}/")
    assert page.inner_text("#trajectory-status") == "truncated"
    assert "Truncated: reached max_turns=2" in page.inner_text("#trajectory-failure")
    roles = page.locator("#turns > li").evaluate_all("items => items.map(item => item.dataset.role)")
    # system (the tools), user, the call, its result, the answer
    assert roles == ["prompt", "prompt", "policy", "tool", "policy"]
    messages = page.locator("#turns .message-text").all_inner_texts()
    assert messages[1] == "What is 2+3?" and messages[3] == "=5" and messages[4] == "2+3 = 5"
    assert messages[2].startswith("<tool_call>") and "You may call these tools" in messages[0]
    assert not any("<|im_start|>" in text for text in messages)  # the template's markup is not the message
    assert "calc(expression=2+3)" in page.inner_text(".turn-policy .tool-call")
    # The tokens the model saw are one click away, trained ones marked.
    assert not page.locator("#turns .span-trained").first.is_visible()
    page.locator("#turns .turn-policy details summary").first.click()
    assert page.locator("#turns .span-trained").first.is_visible()
    trained = page.locator("#turns .span-trained").all_text_contents()
    assert trained[0].startswith("<tool_call>") and trained[0].endswith("</tool_call><|im_end|>")
    page.screenshot(path=str(SCREENSHOTS / "trajectory_chat.png"), full_page=True)


def test_pause_resume_and_clone_from_the_run_page(server, chromium_page, running_run, user):
    api = httpx.Client(base_url=server, headers={"Authorization": f"Token {user.raw_token}"})

    page = chromium_page(server, f"/runs/{running_run.pk}/")
    assert page.is_visible("#pause-form") and not page.is_visible("#resume-form")
    assert page.is_visible("#cancel-form") and page.is_visible("#clone-link")
    page.screenshot(path=str(SCREENSHOTS / "run_detail_running.png"), full_page=True)

    page.click("#pause-form button")
    page.wait_for_selector("#resume-form", state="visible")
    assert page.inner_text("#run-status") == "paused"
    assert not page.is_visible("#pause-form")
    assert "paused" in page.inner_text(".messages")
    assert api.get(f"/api/runs/{running_run.pk}/").json()["status"] == "paused"
    page.screenshot(path=str(SCREENSHOTS / "run_detail_paused.png"), full_page=True)

    page.click("#resume-form button")
    page.wait_for_selector("#pause-form", state="hidden")
    assert page.inner_text("#run-status") == "queued"
    assert not page.is_visible("#resume-form") and page.is_visible("#cancel-form")
    assert api.get(f"/api/runs/{running_run.pk}/").json()["status"] == "queued"

    # Clone opens the new-run form, filled in from the run.
    page.click("#clone-link")
    page.wait_for_url(f"**/runs/new/?clone={running_run.pk}")
    original = api.get(f"/api/runs/{running_run.pk}/").json()
    assert page.input_value("#id_name") == f"{original['name']} (clone)"
    assert page.input_value("#id_config_rl_steps") == str(original["config"]["rl_steps"])
    assert page.input_value("#id_config_sft_steps") == str(original["config"]["sft_steps"])
    page.screenshot(path=str(SCREENSHOTS / "run_clone.png"), full_page=True)
    page.fill("#id_config_rl_steps", str(original["config"]["rl_steps"] + 5))
    page.fill("#id_name", "the clone")
    page.click("#review-run")
    page.locator("#review-table tr[data-path='rl_steps']").wait_for()
    page.click("#start-run")
    page.wait_for_selector("#run-root")
    clone_id = int(page.get_attribute("#run-root", "data-run-id"))
    clone = api.get(f"/api/runs/{clone_id}/").json()

    assert clone_id != running_run.pk and clone["name"] == "the clone" and clone["status"] == "queued"
    assert clone["config"] == {**original["config"], "rl_steps": original["config"]["rl_steps"] + 5}


def test_the_run_list_filters_sorts_updates_live_and_compares(
    server, chromium_page, make_run, project, environment, user
):
    runs = {name: make_run(project, environment=environment, name=name) for name in ("alpha", "beta", "gamma")}
    run_transition(run=runs["gamma"], to_status="cancelled", reason="test")
    for offset, name in enumerate(("alpha", "beta")):
        events = [
            TrainerStepEvent.model_validate(step_event(
                runs[name].pk, step, reward_mean=0.1 * step + offset, success_rate=0.2 * step + 0.1 * offset,
                loss=1.0 / (step + 1) + offset,
            ))
            for step in (1, 2, 3)
        ]
        metric_events_record(run=runs[name], events=events)
    api = httpx.Client(base_url=server, headers={"Authorization": f"Token {user.raw_token}"})

    page = chromium_page(server, "/runs/")

    def names() -> list[str]:
        return [text.split(" #")[0] for text in page.locator("#run-table .run-name").all_inner_texts()]

    assert names() == ["gamma", "beta", "alpha"]  # newest first
    page.click("a.sort[data-sort=name]")
    page.wait_for_url("**sort=name**")
    assert names() == ["alpha", "beta", "gamma"]
    page.click("a.sort[data-sort=name]")
    page.wait_for_url("**sort=-name**")
    assert names() == ["gamma", "beta", "alpha"]
    page.fill("input[name=q]", "ALP")
    page.click("#run-filters button[type=submit]")
    page.wait_for_url("**q=ALP**")
    assert names() == ["alpha"]
    page.goto(f"{server}/runs/?status=cancelled")
    assert names() == ["gamma"]
    page.goto(f"{server}/runs/?environment={environment.name}&sort=name")
    assert names() == ["alpha", "beta", "gamma"]

    # A status change shows without a reload (the list polls the REST API).
    navigations: list[str] = []
    page.on("framenavigated", lambda frame: navigations.append(frame.url))
    assert api.post(f"/api/runs/{runs['beta'].pk}/cancel/").status_code == 200
    page.wait_for_function(
        f"() => document.querySelector('tr[data-run-id=\"{runs['beta'].pk}\"] .run-status').textContent.trim()"
        " === 'cancelled'",
        timeout=15_000,
    )
    assert navigations == []
    assert page.get_attribute(f"tr[data-run-id='{runs['beta'].pk}'] .run-status .badge", "class") == (
        "badge badge-cancelled"
    )

    assert page.is_disabled("#compare-button")
    page.check(f"tr[data-run-id='{runs['alpha'].pk}'] .run-select")
    assert page.is_disabled("#compare-button")
    page.check(f"tr[data-run-id='{runs['beta'].pk}'] .run-select")
    page.screenshot(path=str(SCREENSHOTS / "run_list.png"), full_page=True)
    page.click("#compare-button")
    page.wait_for_url("**/runs/compare/?runs=**")
    page.wait_for_function("() => window.tandemCompare && window.tandemCompare.charts === 3")
    points = page.evaluate("window.tandemCompare.points")
    assert points == {"reward_mean": [3, 3], "success_rate": [3, 3], "loss": [3, 3]}
    for metric in ("reward_mean", "success_rate", "loss"):
        assert page.locator(f"#compare-{metric} canvas").count() == 1
        legend = page.locator(f"#compare-{metric} .u-legend").inner_text()
        assert "alpha" in legend and "beta" in legend
    page.screenshot(path=str(SCREENSHOTS / "run_compare.png"), full_page=True)


def test_every_run_chart_receives_live_points_and_a_trace_can_be_requested(
    server, chromium_page, running_run, trainer
):
    # Posted as the trainer posts them: its platform client, over HTTP, events built by its own code.
    client = PlatformClient(server, trainer.raw_token, trainer_name=TRAINER_NAME)
    client.post_events(running_run.pk, [full_rl_step_event(running_run.pk, 1)])

    page = chromium_page(server, f"/runs/{running_run.pk}/")
    navigations: list[str] = []
    page.on("framenavigated", lambda frame: navigations.append(frame.url))
    page.wait_for_function("() => window.tandemRunPage && window.tandemRunPage.lastStep === 1", timeout=LOADED_MS)
    assert page.get_attribute("#timeline-link", "href") == f"/runs/{running_run.pk}/timeline/"
    assert page.get_attribute("#devices-link", "href") == "/devices/"

    def chart_points() -> dict[str, int]:
        return page.evaluate("({...window.tandemRunPage.chartPoints})")

    backfilled = chart_points()
    assert all(backfilled[chart] > 0 for chart in RUN_CHARTS), backfilled
    for step in range(2, 6):
        client.post_events(running_run.pk, [full_rl_step_event(running_run.pk, step)])
        page.wait_for_function(f"() => window.tandemRunPage.lastStep === {step}", timeout=LOADED_MS)
    page.wait_for_function("(n) => window.tandemRunPage.drawnAt[n] !== undefined", arg=5, timeout=LOADED_MS)
    live = chart_points()
    # Every chart got points of every live step (each step carries the same series).
    assert {chart: live[chart] for chart in RUN_CHARTS} == {
        chart: 5 * backfilled[chart] for chart in RUN_CHARTS}, (backfilled, live)
    for chart in RUN_CHARTS:
        assert page.locator(f"#{chart} canvas").count() == 1, chart
        assert page.is_hidden(f"[data-empty-for={chart}]"), chart

    series = page.evaluate("window.tandemRunPage.chartSeries")
    # Series discovered from the names: per environment, per percentile, per staleness bucket, per stage.
    assert series["chart-latency"] == [f"{env} p{p}" for env in ("calculator", "echo-http") for p in (50, 90, 99)]
    assert series["chart-errors"] == ["calculator", "echo-http"]
    assert series["chart-tools"] == ["calculator"]  # echo-http offers no tools
    assert series["chart-staleness"] == ["1 version", "2 versions", "3 versions", "4 versions"]
    assert series["chart-stages"] == ["data wait", "batch", "host to device", "compute", "publish", "checkpoint",
                                      "telemetry"]
    assert series["chart-kl-entropy"] == ["KL", "entropy (right axis)"]
    page.select_option("select[data-chart-variant=chart-latency]", "generation")
    page.select_option("select[data-chart-variant=chart-staleness]", "in_flight")
    page.wait_for_function("() => window.tandemRunPage.chartSeries['chart-staleness'][0] === '1 version' && "
                           "window.tandemRunPage.chartSeries['chart-staleness'].length === 2")
    # The raw series is drawn faint behind the smoothed one; the legend lists the smoothed one only.
    rows = page.locator("#chart-reward .u-legend .u-series:visible")
    assert rows.locator(".u-label").all_inner_texts() == ["step", "reward mean", "success rate"]
    # Away from the cursor, the legend shows the newest step: smoothed value (raw value).
    assert rows.locator(".u-value").all_inner_texts()[0] == "5"
    assert rows.locator(".u-value").all_inner_texts()[1].endswith("(0.5)")

    # Redraws are coalesced: twenty steps in one post (twenty socket messages) take fewer redraws than
    # messages, and two redraws are never closer than the 250 ms the page allows itself, however the
    # messages are spread (on a loaded machine they arrive over longer).
    redraws = page.evaluate("window.tandemRunPage.redraws")
    client.post_events(running_run.pk, [full_rl_step_event(running_run.pk, step) for step in range(6, 26)])
    page.wait_for_function("() => window.tandemRunPage.drawnAt[25] !== undefined", timeout=LOADED_MS)
    assert page.evaluate("window.tandemRunPage.redraws") - redraws < 20
    assert page.evaluate("window.tandemRunPage.shortestRedrawGapMs") >= 245
    assert chart_points()["chart-latency"] == 25 * backfilled["chart-latency"]

    # Capture trace: the request is listed at once, and the trainer is told of it in its next reply.
    page.fill("#trace-steps", "2")
    page.click("#trace-form button[type=submit]")
    page.wait_for_selector("#traces-table tr[data-status=requested]")
    reply = client.post_events(running_run.pk, [])
    assert [request.steps for request in reply.trace_requests] == [2]
    client.close()

    page.screenshot(path=str(REPO_ROOT / "test-artifacts" / "run_page.png"), full_page=True)
    assert navigations == []


def test_the_run_page_charts_held_out_evaluations_apart_from_the_training_reward(
    server, chromium_page, running_run, trainer
):
    client = PlatformClient(server, trainer.raw_token, trainer_name=TRAINER_NAME)
    client.post_events(running_run.pk, [full_rl_step_event(running_run.pk, step) for step in (1, 2)])
    for index, (step, success) in enumerate(((0, 0.25), (2, 0.5))):
        client.post_evaluation(running_run.pk, EvaluationReport(
            evaluation=index, step=step, policy_version=step, environment="calculator@1", status="complete",
            tasks=4, samples_per_task=4, temperature=0.0, episodes=16,
            metrics={"success_rate": success, "mean_reward": success, "pass@1": success, "pass@4": success + 0.25},
            intervals={"success_rate": (success - 0.2, success + 0.2)}))

    page = chromium_page(server, f"/runs/{running_run.pk}/")
    # Drawn once its series are laid out (redraws are coalesced).
    page.wait_for_function("() => (window.tandemRunPage.chartSeries['chart-evaluation'] || []).length === 3")
    assert page.evaluate("window.tandemRunPage.chartSeries")["chart-evaluation"] == [
        "success rate", "pass@1", "pass@4"]
    assert page.evaluate("window.tandemRunPage.chartPoints")["chart-evaluation"] > 0
    assert page.is_hidden("[data-empty-for=chart-evaluation]")
    # The training reward's chart holds the step events' series only.
    assert "success rate" in page.evaluate("window.tandemRunPage.chartSeries")["chart-reward"]
    assert page.locator("#chart-evaluation canvas").count() == 1
