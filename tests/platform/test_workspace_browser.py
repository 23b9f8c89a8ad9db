"""The project workspace and a report in real Chromium against a real uvicorn: runs overlaid and coloured by
group, a config column sorted and filtered, the whole view in the URL and saved by name, a live step
redrawing a panel over the project's socket, and a report's embedded view drawn for a member.

Any page error or console error fails the test. Screenshots go to test-artifacts/screenshots/.
"""

from __future__ import annotations

import json
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from runs.models import Run
from tandem.contracts import TRAINER_HEADER, TrainerStepEvent
from telemetry.services import metric_events_record
from workspaces.models import SavedView
from workspaces.services import report_create, saved_view_save

from .builders import step_event
from .conftest import TRAINER_NAME
from .test_dashboard_fixes_browser import SCREENSHOTS, open_page  # noqa: F401 - the browser fixture

pytestmark = pytest.mark.django_db(transaction=True)


def _log(run: Run, values: list[float], **also) -> None:
    metric_events_record(run=run, events=[
        TrainerStepEvent.model_validate(step_event(run.pk, step, reward_mean=value, **also))
        for step, value in enumerate(values, start=1)])


def _sweep_of_runs(make_run, project, environment) -> list[Run]:
    runs = []
    for index, (rate, tag) in enumerate([(1e-4, "baseline"), (3e-4, "sweep"), (1e-3, "sweep"), (3e-3, "sweep")]):
        run = make_run(project, environment=environment, name=f"lr-{index}",
                       config={"sft_steps": 0, "rl_steps": 30, "rl_learning_rate": rate})
        Run.objects.filter(pk=run.pk).update(tags=[tag])
        _log(run, [0.1 * index + step / 100 for step in range(30)])
        runs.append(Run.objects.get(pk=run.pk))
    return runs


def _query(page) -> dict[str, list[str]]:
    return parse_qs(urlsplit(page.url).query)


def test_the_workspace_overlays_groups_sorts_filters_and_saves_its_view(
        server, open_page, make_run, project, environment):  # noqa: F811
    runs = _sweep_of_runs(make_run, project, environment)

    page = open_page(server, f"/projects/{project.pk}/workspace/")
    page.goto(f"{server}/projects/{project.pk}/workspace/?m=reward_mean&g=tag")
    page.wait_for_function("window.tandemWorkspace.drawnMs !== null")
    drawn = page.evaluate("window.tandemWorkspace.panels.reward_mean")
    assert drawn["runs"] == 4 and drawn["points"] == 4 * 30
    assert len(set(drawn["colours"])) == 2  # baseline and sweep: a colour per group, not per run
    legend = page.locator("#workspace-legend .workspace-legend-item").all_inner_texts()
    assert legend == ["baseline (1)", "sweep (3)"]

    # A config column, sorted descending, then filtered: the table and the panel follow, and so does the URL.
    page.fill(".workspace-add-column input", "config.rl_learning_rate")
    page.click(".workspace-add-column button")
    page.wait_for_selector("#workspace-table th[data-column='config.rl_learning_rate']")
    page.click("#workspace-table th[data-column='config.rl_learning_rate'] .workspace-sort")
    page.wait_for_function("document.querySelector('#workspace-table th[data-column=\"config.rl_learning_rate\"]')"
                           ".textContent.includes('▲')")
    page.click("#workspace-table th[data-column='config.rl_learning_rate'] .workspace-sort")
    page.wait_for_function("document.querySelector('#workspace-table th[data-column=\"config.rl_learning_rate\"]')"
                           ".textContent.includes('▼')")
    order = page.locator("#workspace-table tbody tr").evaluate_all("rows => rows.map(row => Number(row.dataset.run))")
    assert order == [run.pk for run in reversed(runs)]
    page.fill(".workspace-filter[data-column='config.rl_learning_rate']", "<0.002")
    page.wait_for_function("document.querySelectorAll('#workspace-table tbody tr').length === 3")
    page.wait_for_function("window.tandemWorkspace.panels.reward_mean.runs === 3")
    assert "left out by the column filters" in page.inner_text("#workspace-summary")
    query = _query(page)
    assert query["c"] == ["config.rl_learning_rate"] and query["o"] == ["-config.rl_learning_rate"]
    assert query["f.config.rl_learning_rate"] == ["<0.002"] and query["g"] == ["tag"]

    # Saved by name: the view holds the URL's state, and opening it draws the same runs.
    page.fill("#workspace-save-name", "sweep without the largest rate")
    page.click("#workspace-save button[type=submit]")
    page.wait_for_function("window.tandemWorkspace.saves === 1")
    saved = page.evaluate("location.search")
    assert "view=" in saved
    page.screenshot(path=str(SCREENSHOTS / "workspace.png"), full_page=True)
    page.goto(f"{server}/projects/{project.pk}/workspace/")
    page.wait_for_function("window.tandemWorkspace.drawnMs !== null")
    page.click("#workspace-views a:text('sweep without the largest rate')")
    page.wait_for_function("window.tandemWorkspace.drawnMs !== null && window.tandemWorkspace.panels.reward_mean")
    assert page.evaluate("window.tandemWorkspace.panels.reward_mean.runs") == 3
    assert page.input_value(".workspace-filter[data-column='config.rl_learning_rate']") == "<0.002"


def test_a_live_step_of_any_run_redraws_the_workspace_and_a_zoom_stays_in_the_url(
        server, open_page, running_run, make_run, project, environment, trainer):  # noqa: F811
    _log(running_run, [0.1, 0.2, 0.3])
    other = make_run(project, environment=environment, name="other")
    _log(other, [0.5, 0.5, 0.5])
    trainer_http = httpx.Client(base_url=server, headers={"Authorization": f"Token {trainer.raw_token}",
                                                          TRAINER_HEADER: TRAINER_NAME})
    page = open_page(server, f"/projects/{project.pk}/workspace/")
    page.goto(f"{server}/projects/{project.pk}/workspace/?s=0")
    page.wait_for_function("window.tandemWorkspace.drawnMs !== null")
    assert page.evaluate("window.tandemWorkspace.panels.reward_mean.points") == 6
    # The socket is open once a step sent now arrives: post until the page has heard one.
    for step in range(4, 40):
        posted = trainer_http.post(f"/api/trainer/runs/{running_run.pk}/telemetry/",
                                   json={"events": [step_event(running_run.pk, step, reward_mean=0.9)]})
        assert posted.status_code == 202, posted.text
        try:
            page.wait_for_function("window.tandemWorkspace.liveSteps > 0", timeout=1000)
            break
        except Exception:  # noqa: BLE001 - the socket was not yet open for that step
            continue
    page.wait_for_function("window.tandemWorkspace.redrawMs.length > 0")
    assert page.evaluate("window.tandemWorkspace.panels.reward_mean.runs") == 2

    page.evaluate("""(() => { const input = document.querySelector('[name=smoothing]');
        input.value = '0.5'; input.dispatchEvent(new Event('input')); })()""")
    page.wait_for_function("location.search.includes('s=0.5')")
    page.reload()
    page.wait_for_function("window.tandemWorkspace.drawnMs !== null")
    assert page.input_value("[name=smoothing]") == "0.5"


def test_a_report_embeds_a_saved_view_for_members_and_escapes_its_markdown(
        server, open_page, make_run, project, environment):  # noqa: F811
    _sweep_of_runs(make_run, project, environment)
    saved_view_save(user=project.owner, project=project, name="by tag", query="g=tag&m=reward_mean,loss")
    report = report_create(user=project.owner, project=project, title="Learning-rate sweep", body=(
        "# What we found\n\nThe **sweep** runs beat the baseline.\n\n<script>window.pwned = 1</script>\n\n"
        "{{view: by tag}}\n\n{{view: missing}}\n"))
    assert SavedView.objects.count() == 1

    page = open_page(server, f"/projects/{project.pk}/reports/{report.pk}/")
    page.wait_for_function("window.tandemWorkspace.drawnMs !== null")
    assert page.inner_text(".report-text h1") == "What we found"
    assert page.evaluate("window.pwned") is None  # raw HTML is shown as text, never run
    assert "<script>" in page.inner_text(".report-text")
    assert page.locator(".report-view").count() == 1
    assert page.evaluate("window.tandemWorkspace.panels.reward_mean.runs") == 4
    assert json.loads(json.dumps(page.evaluate("Object.keys(window.tandemWorkspace.panels).sort()"))) == [
        "loss", "reward_mean"]
    assert "No saved view named “missing”" in page.inner_text(".report-missing-view")
    page.screenshot(path=str(SCREENSHOTS / "report.png"), full_page=True)


def test_the_workspace_and_a_report_fit_800_pixels(server, open_page, make_run, project, environment):  # noqa: F811
    _sweep_of_runs(make_run, project, environment)
    saved_view_save(user=project.owner, project=project, name="by tag", query="g=tag&c=config.rl_learning_rate")
    report = report_create(user=project.owner, project=project, title="Narrow", body="{{view: by tag}}")
    page = open_page(server, f"/projects/{project.pk}/workspace/", width=800)
    for path in (f"/projects/{project.pk}/workspace/?g=tag&c=config.rl_learning_rate,config.rollout.group_size",
                 f"/projects/{project.pk}/reports/{report.pk}/", f"/projects/{project.pk}/reports/"):
        page.goto(f"{server}{path}")
        page.wait_for_load_state("load")
        if "reports/" not in path or path.endswith(f"{report.pk}/"):
            page.wait_for_function("window.tandemWorkspace.drawnMs !== null")
        overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
        assert overflow <= 0, (path, overflow)
    page.goto(f"{server}/projects/{project.pk}/workspace/?g=tag")
    page.wait_for_function("window.tandemWorkspace.drawnMs !== null")
    page.screenshot(path=str(SCREENSHOTS / "workspace_narrow.png"), full_page=True)
