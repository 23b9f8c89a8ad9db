"""The dashboard's twelve bugs of issue 35, each shown fixed in real Chromium against a real uvicorn.

Each test fails on the code before the fix. Any page error or console error fails the test
(``open_page``). Screenshots go to test-artifacts/screenshots/.
"""

from __future__ import annotations

import struct
import time

import httpx
import pytest
import redis
from django.conf import settings

from evaluations.services import evaluation_record
from run_logs.services import run_logs_drain
from runs.models import Run
from tandem.contracts import (
    EvaluationReport,
    RunLogRecord,
    TrainerHeartbeat,
    TrainerStepEvent,
    run_log_stream,
)
from telemetry.models import StepTimelineRecord
from telemetry.services import metric_events_record
from trainer.platform_client import PlatformClient
from trajectories.services import trajectory_samples_record

from .builders import step_event
from .conftest import TRAINER_NAME
from .test_dashboard_fixes_browser import SCREENSHOTS, open_page  # noqa: F401 - the browser fixture
from .test_datasets_api import conversation, jsonl, upload
from .test_evaluations_api import evaluation_report
from .test_metric_explorer_browser import _add_panel, _logged_run
from .trajectory_builders import calculator_sample

pytestmark = pytest.mark.django_db(transaction=True)

# A second trainer, for a run claimed while the first holds another.
OTHER_TRAINER = "trainer-host:2"
# A page wider than its window scrolls sideways: none of these may at 800 px.
OVERFLOW = "document.documentElement.scrollWidth - document.documentElement.clientWidth"


def _canvas_fits(page, index: int) -> bool:
    """Whether explorer panel ``index`` draws at its card's width (as it would after a reload)."""
    return page.evaluate(f"""(() => {{ const p = window.tandemExplorer.panels[{index}];
        const chart = p.element.querySelector('.chart');
        return p.plot.width === Math.max(chart.clientWidth, 300)
            && p.plot.root.getBoundingClientRect().right <= chart.getBoundingClientRect().right + 1; }})()""")


def test_1_explorer_panels_follow_their_cards_width_as_panels_come_and_the_window_narrows(
    server, open_page, make_run, project, environment  # noqa: F811
):
    run = _logged_run(make_run, project, environment, name="panels", sft_steps=0)
    page = open_page(server, f"/runs/{run.pk}/")
    page.wait_for_function("window.tandemExplorer.ready")
    _add_panel(page, "rollout/shout/latency_p90_s", 0)
    _add_panel(page, "rollout/calc/latency_p90_s", 1)
    for index in (0, 1):
        page.wait_for_function(f"""(() => {{ const p = window.tandemExplorer.panels[{index}];
            return p.plot.width === Math.max(p.element.querySelector('.chart').clientWidth, 300); }})()""")
        assert _canvas_fits(page, index)

    page.set_viewport_size({"width": 900, "height": 900})
    for index in (0, 1):
        page.wait_for_function(f"""(() => {{ const p = window.tandemExplorer.panels[{index}];
            return p.plot.width === Math.max(p.element.querySelector('.chart').clientWidth, 300); }})()""")
        assert _canvas_fits(page, index)
    page.locator("#metric-explorer").screenshot(path=str(SCREENSHOTS / "explorer_panels_resized.png"))


def test_2_an_evaluation_episode_says_which_step_it_evaluated_and_that_it_was_never_trained_on(
    server, open_page, running_run  # noqa: F811
):
    trained = calculator_sample(running_run.pk, step=4)
    evaluated = calculator_sample(running_run.pk, step=6).model_copy(
        update={"purpose": "evaluation", "trajectory_id": "evaluation-episode"})
    trajectory_samples_record(run=running_run, samples=[trained, evaluated])

    page = open_page(server, f"/runs/{running_run.pk}/trajectories/evaluation-episode/")
    step = page.inner_text("#trajectory-step")
    assert "Evaluated at step" in step and "6" in step and "never trained on" in step
    assert "Trained" not in step

    page.goto(f"{server}/runs/{running_run.pk}/trajectories/{trained.trajectory_id}/")
    assert page.inner_text("#trajectory-step").startswith("Trained in step")


def test_3_a_run_that_evaluates_is_told_when_its_first_evaluation_comes_not_how_to_ask_for_one(
    server, open_page, make_run, project, environment  # noqa: F811
):
    evaluating = make_run(project, environment=environment, config={"rl_steps": 3, "evaluation": {"every_steps": 5}})
    silent = make_run(project, environment=environment, config={"rl_steps": 3})

    page = open_page(server, f"/runs/{evaluating.pk}/")
    text = page.inner_text("[data-empty-for='chart-evaluation']")
    assert "No evaluation yet" in text and "every evaluation.every_steps RL steps" in text
    assert "a run evaluates with an evaluation section" not in text
    # It names no other environment and no dataset: those charts still say how to ask for them.
    assert "name them in the config's evaluation.environments" in page.inner_text(
        "[data-empty-for='chart-evaluation-environments']")

    page.goto(f"{server}/runs/{silent.pk}/")
    assert "a run evaluates with an evaluation section in its config" in page.inner_text(
        "[data-empty-for='chart-evaluation']")


def test_4_the_review_step_refuses_an_sft_dataset_without_training_rows_as_start_would(
    server, open_page, api, project, environment  # noqa: F811
):
    upload(api, project, "exam", jsonl(conversation(metadata={"split": "evaluation"})))

    page = open_page(server, "/runs/new/")
    page.click("#config-section-sft > summary")
    page.locator("[data-rows-add='sft.datasets']").click()
    page.fill("#id_config_sft__datasets__0__name", "exam")
    page.click("#review-run")
    error = page.locator(".config-field[data-path='sft.datasets.0.name'] .field-error")
    error.wait_for()
    assert "exam@1 has no training rows" in error.inner_text()
    assert not page.is_visible("#review")


def test_5_the_eta_of_a_run_in_sft_says_it_is_a_lower_bound_until_an_rl_step_is_timed(
    server, open_page, make_run, project, environment  # noqa: F811
):
    run = make_run(project, environment=environment, config={"sft_steps": 10, "rl_steps": 20})
    started = time.time() - 60
    events = [TrainerStepEvent.model_validate(step_event(run.pk, step, phase="sft")) for step in (1, 2, 3)]
    metric_events_record(run=run, events=events)
    StepTimelineRecord.objects.bulk_create(
        StepTimelineRecord(run=run, step=step, phase="sft", policy_version=0, started_at=started + step,
                           ended_at=started + step + 1, stages={}) for step in (1, 2, 3))
    Run.objects.filter(pk=run.pk).update(status="running", trainer_step=3)

    page = open_page(server, "/runs/")
    eta = page.locator(f"tr[data-run-id='{run.pk}'] .run-eta")
    # 7 SFT steps left at 1 s each; the 20 RL steps are not timed yet.
    assert eta.inner_text() == "· ETA ≥ 7s"
    assert "no RL step is timed yet" in eta.get_attribute("title")


def test_6_live_rows_are_what_a_reload_draws_and_the_run_page_shows_a_resumes_new_attempt(
    server, open_page, project, environment, running_run, trainer, user  # noqa: F811
):
    api = httpx.Client(base_url=server, headers={"Authorization": f"Token {user.raw_token}"})
    page = open_page(server, "/runs/")
    page.wait_for_function("window.tandemRunList.polls >= 1")

    # A run created and started after the page was drawn: its project, progress and duration as a reload has them.
    created = api.post("/api/runs/", json={"project": project.pk, "environment": environment.name, "name": "late",
                                           "config": {"sft_steps": 300, "rl_steps": 5}})
    assert created.status_code == 201, created.text
    late = created.json()["id"]
    other = PlatformClient(server, trainer.raw_token, trainer_name=OTHER_TRAINER)
    claimed = other.claim(OTHER_TRAINER)
    assert claimed is not None and claimed.run_id == late
    other.heartbeat(late, TrainerHeartbeat(worker=OTHER_TRAINER, trainer_step=3))
    other.post_events(late, [TrainerStepEvent.model_validate(step_event(late, step, phase="sft")) for step in (1, 2, 3)])
    other.close()
    row = page.locator(f"tr[data-run-id='{late}']")
    page.wait_for_function(f"""(() => {{ const row = document.querySelector("tr[data-run-id='{late}']");
        return row !== null && row.querySelector('.run-step').textContent === 'SFT 3/300 · RL 0/5'
            && row.dataset.status === 'running'
            && row.querySelector('.run-duration').textContent.trim() !== 'not started'; }})()""", timeout=20_000)
    cells = ("environment", "status", "step", "policy")
    live = {name: row.locator(f".run-{name}").inner_text() for name in cells}
    assert live["environment"] == f"{environment.name} in {project.name}"

    page.reload()
    assert {name: row.locator(f".run-{name}").inner_text() for name in cells} == live

    # The run page: after a pause and a resume, the second attempt shows once the trainer claims it again.
    run_page = open_page(server, f"/runs/{running_run.pk}/")
    assert run_page.inner_text("#run-attempts summary").startswith("Attempts: 1")
    run_page.click("#pause-form button")
    run_page.wait_for_selector("#resume-form", state="visible")
    run_page.click("#resume-form button")
    run_page.wait_for_selector("#pause-form", state="hidden")
    client = PlatformClient(server, trainer.raw_token, trainer_name=TRAINER_NAME)
    again = client.claim(TRAINER_NAME)
    assert again is not None and again.run_id == running_run.pk
    client.heartbeat(running_run.pk, TrainerHeartbeat(worker=TRAINER_NAME))
    client.close()
    run_page.wait_for_function("document.querySelector('#run-attempts summary').textContent.startsWith('Attempts: 2')",
                               timeout=20_000)
    assert run_page.inner_text("#run-trainer") == TRAINER_NAME
    assert run_page.locator("#run-attempts tr[data-attempt]").count() == 2


def test_7_settings_an_alert_rules_kind_needs_are_never_labelled_optional(server, open_page, project):  # noqa: F811
    page = open_page(server, "/alerts/")
    page.select_option("#id_kind", "metric_threshold")
    for name in ("metric", "comparison", "threshold", "steps"):
        field = page.locator(f".alert-rule-field[data-field='{name}']")
        assert field.is_visible()
        label = field.locator("label").inner_text()
        assert "(optional)" not in label and "(required)" in label, label
        assert page.evaluate(f"document.querySelector('[name={name}]').required")
    # What no kind needs is optional.
    assert "(optional)" in page.locator(".alert-rule-field[data-field='webhook_url'] label").inner_text()
    page.select_option("#id_kind", "no_progress")
    assert page.evaluate("document.querySelector('[name=minutes]').required")
    assert not page.locator(".alert-rule-field[data-field='metric']").is_visible()


def test_8_an_evaluations_index_reads_as_an_evaluation_not_a_run_number(server, open_page, running_run):  # noqa: F811
    evaluation_record(run=running_run, report=EvaluationReport.model_validate(evaluation_report(3, step=60)))

    page = open_page(server, "/evaluations/")
    policy = page.locator(".evaluation-row td").nth(1).inner_text()
    assert "evaluation 3 of the run" in policy
    assert "#3" not in policy


def test_9_cancel_selected_looks_disabled_until_a_cancellable_run_is_ticked(server, open_page, running_run):  # noqa: F811
    page = open_page(server, "/runs/")
    button = page.locator("#bulk-cancel-button")
    assert button.is_disabled()
    look = "(() => { const s = getComputedStyle(document.getElementById('bulk-cancel-button')); " \
           "return [s.opacity, s.cursor, s.color]; })()"
    disabled = page.evaluate(look)
    assert float(disabled[0]) < 1 and disabled[1] == "not-allowed"

    page.locator(f"tr[data-run-id='{running_run.pk}'] .run-select").check()
    assert button.is_enabled()
    enabled = page.evaluate(look)
    assert float(enabled[0]) == 1 and enabled[1] == "pointer" and enabled[2] != disabled[2]


def test_10_a_panels_png_has_a_title_and_a_legend_beside_the_chart(
    server, open_page, make_run, project, environment  # noqa: F811
):
    run = _logged_run(make_run, project, environment, name="exported", sft_steps=0)
    page = open_page(server, f"/runs/{run.pk}/")
    page.wait_for_function("window.tandemExplorer.ready")
    panel = _add_panel(page, "rollout/*/latency_p90_s")

    with page.expect_download() as download:
        panel.locator(".explorer-download-png").click()
    png = download.value.path().read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    exported = page.evaluate("window.tandemExplorer.lastPng")
    assert (width, height) == (exported["width"], exported["height"])
    assert height > exported["chartHeight"]  # more than the bare canvas: a title above, a legend below
    assert "rollout/*/latency_p90_s" in exported["title"] and "exported" in exported["title"]
    assert exported["legend"] == ["rollout/calc/latency_p90_s", "rollout/shout/latency_p90_s"]


def test_11_the_run_evaluation_and_trajectory_lists_fit_800_pixels(
    server, open_page, make_run, project, environment, running_run  # noqa: F811
):
    long_name = "a-run-with-a-long-name-" + "x" * 60
    make_run(project, environment=environment, name=long_name, config={"sft_steps": 300, "rl_steps": 500})
    evaluation_record(run=running_run, report=EvaluationReport.model_validate(evaluation_report(0, step=20)))
    trajectory_samples_record(run=running_run, samples=[calculator_sample(running_run.pk, step=step)
                                                        for step in (1, 2)])

    page = open_page(server, "/runs/", width=800)
    for path in ("/runs/", "/evaluations/", f"/runs/{running_run.pk}/trajectories/"):
        page.goto(f"{server}{path}")
        page.wait_for_load_state("load")
        overflow = page.evaluate(OVERFLOW)
        page.screenshot(path=str(SCREENSHOTS / f"narrow_{path.strip('/').replace('/', '_')}.png"), full_page=True)
        assert overflow <= 0, (path, overflow)


def test_12_the_logs_panel_hides_a_chatty_logger(server, open_page, running_run):  # noqa: F811
    client = redis.Redis.from_url(settings.REDIS_URL)
    lines = [("absl", f"Saving checkpoint {n}") for n in range(9)] + [("tandem.trainer", "step 1 done")]
    for logger, message in lines:
        record = RunLogRecord(run_id=running_run.pk, created=time.time(), level="INFO", logger=logger,
                              message=message, role="trainer", hostname="trainer-host", pid=100)
        client.xadd(run_log_stream(running_run.pk), record.to_stream_fields())
    client.close()
    run_logs_drain()

    page = open_page(server, f"/runs/{running_run.pk}/")
    page.wait_for_function("window.tandemRunLogs.shown === 10")
    page.click("#run-logs-loggers > summary")
    absl = page.locator("#run-logs-logger-list input[data-logger='absl']")
    absl.wait_for()
    assert "9 lines" in page.locator("#run-logs-logger-list label").first.inner_text()
    absl.uncheck()
    page.wait_for_function("window.tandemRunLogs.shown === 1")
    assert page.locator("#run-logs-lines .run-log-line").all_inner_texts()[0].endswith("step 1 done")
    assert page.inner_text("#run-logs-hidden-count") == "(1 hidden)"
    absl.check()
    page.wait_for_function("window.tandemRunLogs.shown === 10")


def test_the_logs_api_hides_loggers_and_their_children(api, running_run):
    client = redis.Redis.from_url(settings.REDIS_URL)
    for logger in ("absl", "absl.checkpoint", "abslx", "tandem.trainer"):
        client.xadd(run_log_stream(running_run.pk), RunLogRecord(
            run_id=running_run.pk, created=time.time(), level="INFO", logger=logger, message=logger, role="trainer",
            hostname="trainer-host", pid=100).to_stream_fields())
    client.close()
    run_logs_drain()

    shown = api.get(f"/api/runs/{running_run.pk}/logs/?hide=absl").json()["lines"]
    assert [line["logger"] for line in shown] == ["abslx", "tandem.trainer"]
    loggers = api.get(f"/api/runs/{running_run.pk}/logs/loggers/").json()
    assert sorted((row["logger"], row["lines"]) for row in loggers) == [
        ("absl", 1), ("absl.checkpoint", 1), ("abslx", 1), ("tandem.trainer", 1)]
