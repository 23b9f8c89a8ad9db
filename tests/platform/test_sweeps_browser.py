"""The sweep pages in real Chromium against a real uvicorn: a sweep started from the form, and a finished
sweep's trials, best run, parallel coordinates and parameter importances. Any page or console error fails."""

from __future__ import annotations

import pytest

from sweeps.services import sweep_advance

from .test_dashboard_fixes_browser import SCREENSHOTS, open_page  # noqa: F401 - the browser fixture
from .test_sweeps import _end, _log, _running, _sweep

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_finished_sweep_shows_its_trials_best_run_lines_and_importances(
    server, open_page, project, environment  # noqa: F811
):
    sweep = _sweep(project, environment, max_runs=3, concurrency=3, search_space={
        "rl_learning_rate": {"type": "float", "low": 1e-5, "high": 1e-3, "log": True},
        "rollout.group_size": {"type": "categorical", "choices": [2, 4]}})
    for trial, value in zip(_running(sweep), [0.3, 0.9, 0.6], strict=True):
        _log(trial.run, [0.1, value])
        _end(trial.run)
    sweep_advance(sweep_id=sweep.pk)
    best = sweep.trials.get(value=0.9)

    page = open_page(server, f"/sweeps/{sweep.pk}/")
    assert page.inner_text("#sweep-status") == "finished"
    assert page.get_attribute("#sweep-best a", "href") == f"/runs/{best.run_id}/"
    assert page.locator("#sweep-trials tr[data-trial]").count() == 3
    assert page.get_attribute(f"#sweep-trials tr[data-trial='{best.number}']", "class") == "sweep-best-row"
    page.wait_for_function("window.tandemSweep && window.tandemSweep.lines === 3")
    assert page.evaluate("window.tandemSweep.axes") == ["rl_learning_rate", "rollout.group_size", "reward_mean"]
    shares = page.locator("#sweep-importances .importance-share").all_inner_texts()
    assert len(shares) == 2 and sum(float(share) for share in shares) == pytest.approx(1.0, abs=0.002)
    page.screenshot(path=str(SCREENSHOTS / "sweep_finished.png"), full_page=True)


def test_a_sweep_started_from_the_form_runs_its_first_trials(server, open_page, project, environment):  # noqa: F811
    page = open_page(server, "/sweeps/")
    page.select_option("#id_project", str(project.pk))
    page.fill("#id_environment", environment.name)
    page.fill("#id_name", "from the form")
    page.fill("#id_base_config", '{"sft_steps": 0, "rl_steps": 2}')
    page.fill("#id_search_space", '{"rl_learning_rate": {"type": "float", "low": 0.00001, "high": 0.001}}')
    page.select_option("#id_sampler", "random")
    page.fill("#id_max_runs", "3")
    page.fill("#id_concurrency", "2")
    page.click("#sweep-form button[type=submit]")
    page.wait_for_selector("#sweep-root")
    assert page.inner_text("#sweep-status") == "running"
    assert page.locator("#sweep-trials tr[data-trial]").count() == 2  # its concurrency, started at once

    page.goto(f"{server}/sweeps/")
    page.fill("#id_environment", environment.name)
    page.fill("#id_search_space", '{"rl_learning_rate": {"type": "float", "low": 1}}')
    page.click("#sweep-form button[type=submit]")
    error = page.locator(".sweep-field[data-field='search_space'] .error")
    assert "high" in error.inner_text()
    assert page.locator("#sweep-list tr[data-sweep]").count() == 1  # the refused one was never made
