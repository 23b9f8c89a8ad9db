from tandem.contracts import TrainerStepEvent
from telemetry.services import metric_events_record

from .builders import POINTS_PER_STEP_EVENT, step_event


def _record(run, steps):
    events = [TrainerStepEvent.model_validate(step_event(run.pk, step)) for step in steps]
    metric_events_record(run=run, events=events)


def _metrics(api, run, **params):
    response = api.get(f"/api/runs/{run.pk}/metrics/", params)
    assert response.status_code == 200, response.content
    return response.json()


def test_the_cursor_pages_through_every_point_without_splitting_a_step(api, running_run):
    _record(running_run, range(10))
    limit = 2 * POINTS_PER_STEP_EVENT + 3  # two whole steps and part of a third

    pages, cursor = [], -1
    while True:
        page = _metrics(api, running_run, after_step=cursor, limit=limit)
        if not page["points"]:
            assert page["next_after_step"] is None
            break
        pages.append(page)
        cursor = page["next_after_step"]

    assert len(pages) == 5
    for page in pages:
        steps = [point["step"] for point in page["points"]]
        assert steps == sorted(steps)
        assert page["next_after_step"] == steps[-1]
        assert len(steps) == 2 * POINTS_PER_STEP_EVENT  # whole steps only
    seen = [(p["step"], p["name"]) for page in pages for p in page["points"]]
    assert len(seen) == len(set(seen)) == 10 * POINTS_PER_STEP_EVENT


def test_after_step_returns_only_later_steps(api, running_run):
    _record(running_run, [1, 2, 3])

    page = _metrics(api, running_run, after_step=2)

    assert {point["step"] for point in page["points"]} == {3}
    assert page["run"] == running_run.pk and page["next_after_step"] == 3


def test_names_select_series(api, running_run):
    _record(running_run, [1, 2])

    page = _metrics(api, running_run, after_step=-1, names="loss,reward_mean")

    assert {point["name"] for point in page["points"]} == {"loss", "reward_mean"}
    assert len(page["points"]) == 4
    assert page["points"][0] == {"step": 1, "name": "loss", "value": 0.5}


def test_a_step_larger_than_the_limit_comes_whole(api, running_run):
    _record(running_run, [1, 2])

    page = _metrics(api, running_run, after_step=-1, limit=3)

    assert {point["step"] for point in page["points"]} == {1}
    assert len(page["points"]) == POINTS_PER_STEP_EVENT


def test_a_run_without_telemetry_has_an_empty_page(api, running_run):
    assert _metrics(api, running_run) == {
        "run": running_run.pk,
        "points": [],
        "next_after_step": None,
    }


def test_a_non_integer_cursor_is_400_naming_it(api, running_run):
    response = api.get(f"/api/runs/{running_run.pk}/metrics/?after_step=last")

    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["after_step"]
