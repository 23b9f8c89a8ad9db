"""The metric explorer in real Chromium against a real uvicorn: panels by glob, their options, the
SFT → RL boundary, the layout kept across a reload, downloads, and a comparison of three runs.

Any page error or console error fails the test. Screenshots go to test-artifacts/screenshots/.
"""

from __future__ import annotations

import csv
import io

import pytest
from playwright.sync_api import sync_playwright

from tandem.contracts import TrainerStepEvent
from telemetry.services import metric_events_record
from tests.browser import launch_chromium, log_in

from .builders import step_event
from .test_run_page_browser import REPO_ROOT

pytestmark = pytest.mark.django_db(transaction=True)

SCREENSHOTS = REPO_ROOT / "test-artifacts" / "screenshots"
LATENCIES = "rollout/*/latency_p90_s"


@pytest.fixture
def open_page():
    """``open_page(server, next_path)``: a signed-in page whose page and console errors fail the test."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    started: dict = {}

    def open_(base: str, next_path: str):
        if not started:
            started["playwright"] = sync_playwright().start()
            started["browser"] = launch_chromium(started["playwright"])
            started["context"] = started["browser"].new_context(viewport={"width": 1280, "height": 900},
                                                                accept_downloads=True)
        page = started["context"].new_page()
        page.on("pageerror", lambda error: errors.append(f"pageerror: {error}"))
        page.on("console", lambda message: errors.append(f"console: {message.text}")
                if message.type == "error" else None)
        log_in(page, base, next_path, username="alice", password="pw")
        return page

    yield open_
    if started:
        started["context"].close()
        started["browser"].close()
        started["playwright"].stop()
    assert errors == [], errors


def _logged_run(make_run, project, environment, *, name: str, sft_steps: int, learning_rate: float = 1e-5,
                latency_scale: float = 1.0):
    """A run of ``sft_steps`` SFT steps then 3 RL steps, each RL step logging two environments' latencies."""
    run = make_run(project, environment=environment, name=name,
                   config={"sft_steps": sft_steps, "rl_steps": 3, "learning_rate": learning_rate})
    events = []
    for step in range(1, sft_steps + 4):
        rl = step > sft_steps
        metrics = {"rollout/shout/latency_p90_s": latency_scale * step, "rollout/calc/latency_p90_s": 0.5} if rl else {}
        events.append(TrainerStepEvent.model_validate(step_event(
            run.pk, step, phase="rl" if rl else "sft", samples_per_s=2.0 if rl else None, rollout_metrics=metrics)))
    metric_events_record(run=run, events=events)
    return run


def _add_panel(page, pattern: str, index: int = 0):
    page.fill("#explorer-pattern", pattern)
    page.click("#explorer-add button[type=submit]")
    page.wait_for_function(f"window.tandemExplorer.panels[{index}] && window.tandemExplorer.panels[{index}].plot")
    return page.locator(".explorer-panel").nth(index)


def _panel(page, index: int = 0) -> dict:
    return page.evaluate(f"""(() => {{ const p = window.tandemExplorer.panels[{index}];
        return {{names: p.names, boundaries: p.boundaries, yScale: p.yScale, xScale: p.xScale, points: p.points,
                 distr: p.plot.scales.y.distr, xAxis: p.xAxis, logScale: p.logScale, yMin: p.yMin, yMax: p.yMax,
                 last: p.plot.data[1][p.plot.data[1].length - 1]}}; }})()""")


def test_a_panel_by_glob_with_log_scale_y_range_rl_steps_and_its_layout_kept_across_a_reload(
    server, open_page, make_run, project, environment
):
    run = _logged_run(make_run, project, environment, name="sft-then-rl", sft_steps=2)
    page = open_page(server, f"/runs/{run.pk}/")
    page.wait_for_function("window.tandemExplorer.ready")
    page.fill("#explorer-pattern", LATENCIES)
    assert page.inner_text("#explorer-matches") == "2 series match"
    panel = _add_panel(page, LATENCIES)
    drawn = _panel(page)
    assert drawn["names"] == ["rollout/calc/latency_p90_s", "rollout/shout/latency_p90_s"]
    assert drawn["points"] == [3, 3] and drawn["xAxis"] == "step" and drawn["boundaries"] == [2]

    panel.locator(".explorer-log").check()
    page.wait_for_function("window.tandemExplorer.panels[0].plot.scales.y.distr === 3")
    panel.locator(".explorer-y-min").fill("0.1")
    panel.locator(".explorer-y-min").dispatch_event("change")
    panel.locator(".explorer-y-max").fill("100")
    panel.locator(".explorer-y-max").dispatch_event("change")
    page.wait_for_function("window.tandemExplorer.panels[0].yScale[1] === 100")
    assert _panel(page)["yScale"] == [0.1, 100]

    panel.locator(".explorer-x-axis").select_option("rl_step")
    page.wait_for_function("window.tandemExplorer.panels[0].xAxis === 'rl_step'")
    drawn = _panel(page)
    assert drawn["boundaries"] == [0]  # the SFT → RL line, at RL step 0
    assert drawn["xScale"][0] <= 1 and drawn["xScale"][1] >= 3  # RL steps 1 to 3
    page.locator("#metric-explorer").screenshot(path=str(SCREENSHOTS / "metric_explorer_panel.png"))

    panel.locator(".explorer-reset").click()  # a control, not only the double-click
    page.wait_for_function("!window.tandemExplorer.saving")  # saves are debounced: the last one stored
    page.reload()
    page.wait_for_function("window.tandemExplorer.ready && window.tandemExplorer.panels[0].plot")
    kept = _panel(page)
    assert (kept["xAxis"], kept["logScale"], kept["yMin"], kept["yMax"]) == ("rl_step", True, 0.1, 100)
    assert kept["distr"] == 3 and kept["boundaries"] == [0]
    assert page.input_value(".explorer-panel .explorer-y-min") == "0.1"


def test_a_panels_csv_and_png_downloads(server, open_page, make_run, project, environment):
    run = _logged_run(make_run, project, environment, name="downloaded", sft_steps=0)
    page = open_page(server, f"/runs/{run.pk}/")
    page.wait_for_function("window.tandemExplorer.ready")
    panel = _add_panel(page, "rollout/shout/latency_p90_s")

    with page.expect_download() as download:
        panel.locator(".explorer-download-csv").click()
    rows = list(csv.reader(io.StringIO(download.value.path().read_text())))
    assert rows == [
        ["run", "run_name", "step", "rl_step", "wall_time_s", "samples_trained", "rollout/shout/latency_p90_s"],
        [str(run.pk), "downloaded", "1", "1", "1.0", "2.0", "1.0"],
        [str(run.pk), "downloaded", "2", "2", "2.0", "4.0", "2.0"],
        [str(run.pk), "downloaded", "3", "3", "3.0", "6.0", "3.0"],
    ]

    with page.expect_download() as download:
        panel.locator(".explorer-download-png").click()
    assert download.value.suggested_filename == "rollout_shout_latency_p90_s.png"
    assert download.value.path().read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_comparing_three_runs_aligns_rl_steps_smooths_and_diffs_only_differing_config_keys(
    server, open_page, make_run, project, environment
):
    runs = [
        _logged_run(make_run, project, environment, name="long-sft", sft_steps=3),
        _logged_run(make_run, project, environment, name="no-sft", sft_steps=0, latency_scale=2.0),
        _logged_run(make_run, project, environment, name="other-lr", sft_steps=0, learning_rate=3e-5),
    ]
    page = open_page(server, f"/runs/compare/?runs={','.join(str(run.pk) for run in runs)}")
    keys = page.eval_on_selector_all("#compare-config-diff tbody tr", "rows => rows.map(r => r.dataset.key)")
    assert keys == ["learning_rate", "sft_steps"]
    assert page.inner_text("#compare-config-diff tr[data-key=sft_steps]").split() == ["sft_steps", "3", "0", "0"]

    page.wait_for_function("window.tandemExplorer.ready")
    _add_panel(page, "rollout/shout/latency_p90_s")
    drawn = _panel(page)
    assert drawn["xAxis"] == "rl_step" and drawn["boundaries"] == [0]
    # RL steps 1, 2, 3 of every run, whatever their SFT steps: one shared x column of three.
    assert page.evaluate("window.tandemExplorer.panels[0].plot.data[0]") == [1, 2, 3]
    assert drawn["points"] == [3, 3, 3]

    page.fill("#explorer-smoothing", "0")
    page.dispatch_event("#explorer-smoothing", "input")
    page.wait_for_function("window.tandemExplorer.panels[0].plot.data[1][2] === 6")  # long-sft's raw 6 at RL step 3
    page.fill("#explorer-smoothing", "0.5")
    page.dispatch_event("#explorer-smoothing", "input")
    # The dashboard's one smoothing (charts.js), the run page's too: the EMA of 4, 5, 6 with weight 0.5
    # debiased, (0.125*4 + 0.25*5 + 0.5*6) / (1 - 0.5**3) = 38/7 (a plain EMA would give 5.25).
    page.wait_for_function("Math.abs(window.tandemExplorer.panels[0].plot.data[1][2] - 38 / 7) < 1e-9")
    page.screenshot(path=str(SCREENSHOTS / "metric_explorer_compare.png"), full_page=True)

    with page.expect_download() as download:
        page.locator(".explorer-panel .explorer-download-csv").click()
    rows = list(csv.reader(io.StringIO(download.value.path().read_text())))
    assert [row[1] for row in rows[1:]] == ["long-sft"] * 3 + ["no-sft"] * 3 + ["other-lr"] * 3


def test_a_glob_split_into_a_panel_per_series(server, open_page, make_run, project, environment):
    run = _logged_run(make_run, project, environment, name="split", sft_steps=0)
    page = open_page(server, f"/runs/{run.pk}/")
    page.wait_for_function("window.tandemExplorer.ready")

    page.check("#explorer-split")
    page.fill("#explorer-pattern", LATENCIES)
    page.click("#explorer-add button[type=submit]")
    page.wait_for_function("window.tandemExplorer.panels.length === 2 && window.tandemExplorer.panels.every(p => p.plot)")
    assert [_panel(page, index)["names"] for index in (0, 1)] == [
        ["rollout/calc/latency_p90_s"], ["rollout/shout/latency_p90_s"]]
    assert page.locator(".explorer-panel .explorer-panel-title").all_inner_texts() == [
        "rollout/calc/latency_p90_s", "rollout/shout/latency_p90_s"]


def test_panels_fall_into_sections_by_their_series_first_name_part(server, open_page, make_run, project, environment):
    run = _logged_run(make_run, project, environment, name="sections", sft_steps=0)
    page = open_page(server, f"/runs/{run.pk}/")
    page.wait_for_function("window.tandemExplorer.ready")
    for index, pattern in enumerate(["rollout/shout/latency_p90_s", "loss", "rollout/calc/latency_p90_s", "reward_*"]):
        _add_panel(page, pattern, index)
    sections = page.locator("#explorer-panels > .explorer-section")
    assert sections.evaluate_all("nodes => nodes.map(node => node.dataset.section)") == ["general", "rollout"]
    assert page.inner_text(".explorer-section[data-section='rollout'] .explorer-section-count") == "(2 panels)"
    assert page.locator(".explorer-section[data-section='general'] .explorer-panel-title").all_inner_texts() == [
        "loss", "reward_*"]
    page.click(".explorer-section[data-section='rollout'] > summary")  # folded: its panels are out of sight
    assert not page.locator(".explorer-section[data-section='rollout'] .explorer-panel").first.is_visible()
    assert page.locator(".explorer-section[data-section='general'] .explorer-panel").first.is_visible()
    for _ in range(2):
        page.locator(".explorer-section[data-section='general'] .explorer-remove").first.click()
    page.wait_for_function("window.tandemExplorer.panels.length === 2")
    assert sections.evaluate_all("nodes => nodes.map(node => node.dataset.section)") == ["rollout"]
