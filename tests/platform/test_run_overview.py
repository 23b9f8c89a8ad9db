"""The run page's overview: where the run stands, its series at their end and their best, and its config as
a tree marked where it differs from the defaults."""

from __future__ import annotations

import pytest

from runs.config_diff import config_tree
from tandem.configs.run import RunConfig
from tandem.contracts import TrainerStepEvent
from telemetry.selectors import metric_summaries
from telemetry.services import metric_events_record

from .builders import step_event
from .test_dashboard_fixes_browser import SCREENSHOTS, open_page  # noqa: F401 - the browser fixture

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_overview_shows_final_and_best_metrics_and_what_the_config_changes(
    server, open_page, make_run, project, environment  # noqa: F811
):
    run = make_run(project, environment=environment, config={"sft_steps": 0, "rl_steps": 7,
                                                              "rollout": {"group_size": 4}})
    rewards, losses = [0.2, 0.9, 0.5], [2.0, 0.5, 1.5]
    metric_events_record(run=run, events=[TrainerStepEvent.model_validate(
        step_event(run.pk, step, reward_mean=reward, loss=loss))
        for step, (reward, loss) in enumerate(zip(rewards, losses, strict=True), start=1)])
    fresh = make_run(project, environment=environment)

    page = open_page(server, f"/runs/{run.pk}/")
    reward = page.locator("#overview-metrics tr[data-metric='reward_mean']")
    assert reward.locator(".overview-final").inner_text() == "0.5000 at step 3"
    assert reward.locator(".overview-best").inner_text() == "0.9000 at step 2 (highest)"
    loss = page.locator("#overview-metrics tr[data-metric='loss']")
    assert loss.locator(".overview-best").inner_text() == "0.5000 at step 2 (lowest)"
    changed = set(page.eval_on_selector_all("#overview-changes tr[data-path]", "rows => rows.map(r => r.dataset.path)"))
    assert {"rl_steps", "sft_steps", "rollout.group_size"} <= changed
    page.click("#overview-config-tree > summary")
    row = page.locator("#overview-config-tree tr[data-path='rollout.group_size']")
    assert "config-changed" in row.get_attribute("class") and "default" in row.inner_text()
    assert "config-changed" in page.get_attribute("#overview-config-tree tr[data-path='rollout']", "class")
    assert "config-changed" not in page.get_attribute("#overview-config-tree tr[data-path='sampling']", "class")
    page.locator("#run-overview").screenshot(path=str(SCREENSHOTS / "run_overview.png"))

    page.goto(f"{server}/runs/{fresh.pk}/")
    assert page.is_visible("#overview-no-metrics")


def test_the_best_of_a_series_is_its_first_step_at_that_value(make_run, project, environment):
    run = make_run(project, environment=environment)
    metric_events_record(run=run, events=[TrainerStepEvent.model_validate(step_event(run.pk, step, loss=loss))
                                          for step, loss in ((1, 1.0), (2, 0.5), (3, 0.5), (4, 0.7))])
    [loss] = metric_summaries(run=run, names=["loss", "never_logged"], lower_is_better=["loss"])
    assert (loss.final, loss.final_step, loss.best, loss.best_step) == (0.7, 4, 0.5, 2)


def test_the_config_tree_marks_a_section_turned_on_and_every_field_under_it():
    defaults = RunConfig().model_dump(mode="json")
    config = RunConfig.model_validate({"evaluation": {"every_steps": 5}}).model_dump(mode="json")
    rows = {row["path"]: row for row in config_tree(config, defaults)}
    assert rows["evaluation"]["changed"] and rows["evaluation.every_steps"]["changed"]
    assert rows["evaluation.every_steps"]["default"] is None  # a section off by default has no default here
    assert not rows["sampling"]["changed"] and rows["sampling"]["value"] is None
    assert [row["depth"] for row in config_tree({"a": {"b": {"c": 1}}}, {})] == [0, 1, 2]


def test_the_explorer_comes_before_the_fixed_charts_and_every_section_is_one_click_away(
    server, open_page, make_run, project, environment  # noqa: F811
):
    run = make_run(project, environment=environment)

    page = open_page(server, f"/runs/{run.pk}/")
    page.wait_for_function("window.tandemExplorer && window.tandemExplorer.ready")
    explorer_top = page.evaluate("document.getElementById('metric-explorer').getBoundingClientRect().top")
    charts_top = page.evaluate("document.getElementById('run-chart-grid').getBoundingClientRect().top")
    overview_top = page.evaluate("document.getElementById('run-overview').getBoundingClientRect().top")
    assert overview_top < explorer_top < charts_top
    targets = page.eval_on_selector_all("#run-sections a", "links => links.map(a => a.getAttribute('href'))")
    assert targets[:3] == ["#run-overview", "#metric-explorer", "#run-chart-grid"]
    for target in targets:
        assert page.locator(target).count() == 1, target
    page.click("#run-sections a[href='#run-logs']")
    page.wait_for_function("document.getElementById('run-logs').getBoundingClientRect().top < window.innerHeight")
