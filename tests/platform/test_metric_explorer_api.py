"""The metric explorer's API: a run's series names, downloads of any series as CSV or JSON with every
x-axis, and each user's saved layout."""

import csv
import io

import pytest

from tandem.contracts import TrainerStepEvent
from telemetry.services import metric_events_record

from .builders import step_event

pytestmark = pytest.mark.django_db

LATENCY_SHOUT = "rollout/shout/latency_p90_s"
LATENCY_CALC = "rollout/calc/latency_p90_s"
FORMULA = "=HYPERLINK(1)"  # a series name a spreadsheet would run


def _step(run, step: int, *, phase: str, wall_s: float, samples_per_s=None, rollout_metrics=None):
    return TrainerStepEvent.model_validate(step_event(
        run.pk, step, phase=phase, wall_s=wall_s, wait_s=0.0, compute_s=wall_s, publish_s=0.0, other_s=0.0,
        samples_per_s=samples_per_s, rollout_metrics=rollout_metrics or {},
    ))


@pytest.fixture
def logged_run(make_run, project, environment):
    """Two SFT steps (1, 2), then two RL steps (3, 4) that log per-environment latencies."""
    run = make_run(project, environment=environment, config={"sft_steps": 2, "rl_steps": 2}, name="logged")
    metric_events_record(run=run, events=[
        _step(run, 1, phase="sft", wall_s=1.0),
        _step(run, 2, phase="sft", wall_s=2.0),
        _step(run, 3, phase="rl", wall_s=3.0, samples_per_s=2.0,
              rollout_metrics={LATENCY_SHOUT: 0.5, LATENCY_CALC: 0.25}),
        _step(run, 4, phase="rl", wall_s=4.0, samples_per_s=2.0,
              rollout_metrics={LATENCY_SHOUT: 0.75, FORMULA: 5.0}),
    ])
    return run


@pytest.fixture
def outsider_api(make_user, make_project, client_for):
    """A user of another project only."""
    outsider = make_user("mallory")
    make_project(owner=outsider, name="mallory-project")
    return client_for(outsider)


def test_names_lists_every_series_the_run_logged(api, logged_run):
    names = api.get(f"/api/runs/{logged_run.pk}/metrics/names/").json()["names"]
    assert names == sorted(names)
    assert {LATENCY_SHOUT, LATENCY_CALC, FORMULA, "loss", "wall_s", "samples_per_s"} <= set(names)


def test_json_export_holds_the_globbed_series_by_step_with_every_x_axis(api, logged_run):
    response = api.get(f"/api/runs/{logged_run.pk}/metrics/export/",
                       {"names": "rollout/*/latency_p90_s", "format": "json"})
    assert response.status_code == 200
    assert response["Content-Disposition"] == f'attachment; filename="run-{logged_run.pk}-metrics.json"'
    assert response.json() == {
        "run": logged_run.pk, "name": "logged", "sft_steps": 2,
        "names": [LATENCY_CALC, LATENCY_SHOUT],
        "steps": [3, 4],
        "rl_step": [1, 2],
        "wall_time_s": [6.0, 10.0],  # 1 + 2 + 3, then + 4
        "samples_trained": [6.0, 14.0],  # 2/s * 3 s, then + 2/s * 4 s
        "series": {LATENCY_CALC: [0.25, None], LATENCY_SHOUT: [0.5, 0.75]},
    }


def test_csv_export_has_a_row_per_step_and_quotes_formula_like_cells(api, logged_run):
    response = api.get(f"/api/runs/{logged_run.pk}/metrics/export/",
                       {"names": f"{LATENCY_SHOUT},{FORMULA}", "format": "csv"})
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows == [
        ["run", "run_name", "step", "rl_step", "wall_time_s", "samples_trained", "'" + FORMULA, LATENCY_SHOUT],
        [str(logged_run.pk), "logged", "3", "1", "6.0", "6.0", "", "0.5"],
        [str(logged_run.pk), "logged", "4", "2", "10.0", "14.0", "5.0", "0.75"],
    ]


def test_sft_steps_have_negative_rl_steps(api, logged_run):
    body = api.get(f"/api/runs/{logged_run.pk}/metrics/export/", {"names": "loss"}).json()
    assert body["steps"] == [1, 2, 3, 4]
    assert body["rl_step"] == [-1, 0, 1, 2]
    assert body["wall_time_s"] == [1.0, 3.0, 6.0, 10.0]


def test_export_names_a_missing_or_empty_names_parameter(api, logged_run):
    response = api.get(f"/api/runs/{logged_run.pk}/metrics/export/", {"format": "csv"})
    assert response.status_code == 400
    assert "names" in response.json()["error"]["fields"]


def test_another_projects_user_gets_404_from_names_and_exports(outsider_api, logged_run):
    for path in (f"/api/runs/{logged_run.pk}/metrics/names/",
                 f"/api/runs/{logged_run.pk}/metrics/export/?names=loss&format=csv",
                 f"/api/runs/{logged_run.pk}/metrics/export/?names=loss",
                 f"/api/metrics/export/?runs={logged_run.pk}&names=loss"):
        assert outsider_api.get(path).status_code == 404, path


def test_compare_export_puts_each_runs_rows_one_after_another(api, make_run, project, environment, logged_run):
    plain = make_run(project, environment=environment, config={"sft_steps": 0, "rl_steps": 1}, name="plain")
    metric_events_record(run=plain, events=[
        _step(plain, 1, phase="rl", wall_s=1.5, rollout_metrics={LATENCY_SHOUT: 0.1})])
    response = api.get("/api/metrics/export/",
                       {"runs": f"{plain.pk},{logged_run.pk}", "names": LATENCY_SHOUT, "format": "csv"})
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[1:] == [
        [str(plain.pk), "plain", "1", "1", "1.5", "0.0", "0.1"],
        [str(logged_run.pk), "logged", "3", "1", "6.0", "6.0", "0.5"],
        [str(logged_run.pk), "logged", "4", "2", "10.0", "14.0", "0.75"],
    ]
    body = api.get("/api/metrics/export/", {"runs": f"{plain.pk},{logged_run.pk}", "names": LATENCY_SHOUT}).json()
    assert [run["run"] for run in body["runs"]] == [plain.pk, logged_run.pk]
    assert api.get("/api/metrics/export/", {"runs": ",".join(str(i) for i in range(1, 12)),
                                            "names": "loss"}).status_code == 400


@pytest.mark.parametrize("steps", [1, 40])
def test_names_and_exports_take_a_fixed_number_of_queries(
    api, make_run, project, environment, steps, django_assert_num_queries
):
    run = make_run(project, environment=environment, config={"sft_steps": 0, "rl_steps": steps})
    metric_events_record(run=run, events=[
        _step(run, step, phase="rl", wall_s=1.0, rollout_metrics={LATENCY_SHOUT: 1.0, LATENCY_CALC: 2.0})
        for step in range(1, steps + 1)])
    api.get("/api/projects/")  # records the token's last use, a write that happens once a minute
    # The token with its user (1), the run (1), its series names (1), then the points (1) whatever
    # the steps; a comparison reads its runs at once, then each run's names and points.
    with django_assert_num_queries(3):
        api.get(f"/api/runs/{run.pk}/metrics/names/")
    with django_assert_num_queries(4):
        api.get(f"/api/runs/{run.pk}/metrics/export/?names=rollout/*&format=csv")
    with django_assert_num_queries(4):
        api.get(f"/api/metrics/export/?runs={run.pk}&names=rollout/*")


def test_layout_is_saved_per_user_and_page(api, client_for, make_user):
    assert api.get("/api/metric-explorer/layout/?page=run").json() == {"page": "run", "smoothing": 0.6, "panels": []}
    layout = {"page": "run", "smoothing": 0.3, "panels": [
        {"pattern": "rollout/*/latency_p90_s", "x_axis": "rl_step", "log_scale": True, "y_min": 0.1, "y_max": None}]}
    assert api.put("/api/metric-explorer/layout/", layout, format="json").status_code == 200
    assert api.get("/api/metric-explorer/layout/?page=run").json() == layout
    assert api.get("/api/metric-explorer/layout/?page=compare").json()["panels"] == []
    assert client_for(make_user("bob")).get("/api/metric-explorer/layout/?page=run").json()["panels"] == []


def test_layout_refuses_a_y_range_upside_down_and_an_unknown_axis(api):
    bad_range = {"page": "run", "panels": [{"pattern": "loss", "y_min": 2, "y_max": 1}]}
    response = api.put("/api/metric-explorer/layout/", bad_range, format="json")
    assert response.status_code == 400 and "panels.0.y_max" in response.json()["error"]["fields"]
    bad_axis = {"page": "run", "panels": [{"pattern": "loss", "x_axis": "epoch"}]}
    assert api.put("/api/metric-explorer/layout/", bad_axis, format="json").status_code == 400
    assert api.get("/api/metric-explorer/layout/?page=nowhere").status_code == 400
