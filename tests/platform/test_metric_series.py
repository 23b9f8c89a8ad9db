"""``GET /api/runs/<id>/metrics/series/``: charts of any range at a requested resolution."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from telemetry.models import MetricPoint
from telemetry.services import metric_buckets_rebuild

STEPS = 20_000


@pytest.fixture
def long_run(running_run):
    """``loss`` at every step 0..19999 with value == step, ``eval`` at every 100th: -step."""
    points = [
        MetricPoint(run=running_run, name="loss", step=step, value=float(step))
        for step in range(STEPS)
    ] + [
        MetricPoint(run=running_run, name="eval", step=step, value=-float(step))
        for step in range(0, STEPS, 100)
    ]
    MetricPoint.objects.bulk_create(points, batch_size=5000)
    metric_buckets_rebuild(run=running_run)
    return running_run


def _chart(api, run, **params):
    response = api.get(f"/api/runs/{run.pk}/metrics/series/", params)
    assert response.status_code == 200, response.content
    return response.json()


def test_a_full_range_comes_as_the_coarsest_buckets_that_still_give_the_points_asked(
    api, long_run
):
    chart = _chart(api, long_run, names="loss", points=1000)

    # 20000 steps: 1250 buckets of 16 steps; 64 would give only 313.
    assert (chart["from_step"], chart["to_step"], chart["resolution"]) == (0, STEPS - 1, 16)
    loss = chart["series"]["loss"]
    assert len(loss["mean"]) == 1250
    assert set(loss) == {"first_step", "last_step", "count", "min", "max", "mean"}
    # Bucket i holds steps 16i..16i+15, whose values are their steps.
    assert loss["first_step"][10] == 160 and loss["last_step"][10] == 175
    assert loss["count"][10] == 16
    assert (loss["min"][10], loss["max"][10], loss["mean"][10]) == (160.0, 175.0, 167.5)
    assert loss["first_step"] == sorted(loss["first_step"])


def test_a_small_recent_range_comes_as_raw_points(api, long_run):
    chart = _chart(api, long_run, names="loss,eval", points=1000, from_step=18_500, to_step=19_999)

    assert chart["resolution"] == 1
    loss, evals = chart["series"]["loss"], chart["series"]["eval"]
    assert loss["first_step"] == loss["last_step"] == list(range(18_500, 20_000))
    assert loss["mean"] == loss["min"] == loss["max"] == [float(s) for s in range(18_500, 20_000)]
    assert set(loss["count"]) == {1}
    assert evals["first_step"] == list(range(18_500, 20_000, 100))
    assert evals["mean"] == [-float(s) for s in range(18_500, 20_000, 100)]


def test_a_range_of_exactly_four_times_the_points_uses_the_finest_buckets(api, long_run):
    chart = _chart(api, long_run, names="loss", points=1000, from_step=5000, to_step=8999)

    assert chart["resolution"] == 4
    assert len(chart["series"]["loss"]["mean"]) == 1000
    assert chart["series"]["loss"]["mean"][0] == 5001.5


def test_between_two_stored_resolutions_the_finer_buckets_are_merged_to_at_most_twice_the_points(
    api, long_run
):
    chart = _chart(api, long_run, names="loss", points=2000)

    # 5000 buckets of 4 steps, 1250 of 16: the 4s are merged in pairs, 2500 of 8 steps.
    assert chart["resolution"] == 8
    loss = chart["series"]["loss"]
    assert len(loss["mean"]) == 2500
    assert (loss["first_step"][10], loss["last_step"][10], loss["count"][10]) == (80, 87, 8)
    assert (loss["min"][10], loss["max"][10], loss["mean"][10]) == (80.0, 87.0, 83.5)


def test_a_range_under_four_times_the_points_merges_raw_points(api, long_run):
    chart = _chart(api, long_run, names="loss,eval", points=1000, from_step=1000, to_step=3999)

    assert chart["resolution"] == 3  # 1000 buckets of 3 steps; 4 would give 750
    loss, evals = chart["series"]["loss"], chart["series"]["eval"]
    # Buckets start at multiples of 3, so whole ones reach out to 999 and 4001.
    assert len(loss["mean"]) == 1001 and loss["last_step"][-1] == 4001
    assert (loss["first_step"][0], loss["last_step"][0], loss["mean"][0]) == (999, 1001, 1000.0)
    # A sparse series keeps one bucket per point it has.
    assert evals["first_step"] == list(range(1000, 4001, 100))  # 4000: in the bucket 3999-4001
    assert set(evals["count"]) == {1}


def test_buckets_at_the_edges_of_a_range_are_whole_and_say_which_steps_they_hold(api, long_run):
    chart = _chart(api, long_run, names="loss", points=1000, from_step=5001, to_step=9001)

    loss = chart["series"]["loss"]
    assert chart["resolution"] == 4
    assert (loss["first_step"][0], loss["last_step"][-1]) == (5000, 9003)
    assert len(loss["mean"]) == 1001


def test_one_point_asked_is_one_bucket_of_everything(api, long_run):
    chart = _chart(api, long_run, names="loss", points=1)

    assert chart["resolution"] == 65536
    assert chart["series"]["loss"] == {
        "first_step": [0], "last_step": [STEPS - 1], "count": [STEPS],
        "min": [0.0], "max": [float(STEPS - 1)], "mean": [(STEPS - 1) / 2],
    }


def test_without_names_or_bounds_the_chart_has_every_series_over_its_whole_extent(
    api, long_run
):
    chart = _chart(api, long_run, points=100)

    assert list(chart["series"]) == ["eval", "loss"]
    assert (chart["from_step"], chart["to_step"]) == (0, STEPS - 1)
    # Buckets of 64 (313 of them) merged 3 at a time: 105; 4 at a time would give 79.
    assert chart["resolution"] == 192
    assert len(chart["series"]["loss"]["mean"]) == 105
    assert sum(chart["series"]["eval"]["count"]) == STEPS // 100
    assert sum(chart["series"]["loss"]["count"]) == STEPS


def test_a_long_range_is_answered_from_buckets_without_reading_raw_points(long_run):
    from telemetry.selectors import metric_chart

    with CaptureQueriesContext(connection) as queries:
        chart = metric_chart(run=long_run, names=["loss"], points=1000)
    assert chart.resolution == 16
    assert queries.captured_queries
    assert not any(MetricPoint._meta.db_table in q["sql"] for q in queries.captured_queries)


def test_unknown_series_and_empty_ranges_are_empty(api, long_run, running_run):
    chart = _chart(api, long_run, names="loss,nope", from_step=30_000, to_step=40_000)
    assert chart["series"]["loss"]["mean"] == [] and chart["series"]["nope"]["count"] == []

    assert _chart(api, long_run, names="nope") == {
        "run": long_run.pk, "from_step": None, "to_step": None, "resolution": 1,
        "series": {"nope": {
            "first_step": [], "last_step": [], "count": [], "min": [], "max": [], "mean": [],
        }},
    }


def test_a_run_without_telemetry_has_no_series(api, running_run):
    assert _chart(api, running_run) == {
        "run": running_run.pk, "from_step": None, "to_step": None, "resolution": 1,
        "series": {},
    }


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"points": "many"}, "points"),
        ({"points": 0}, "points"),
        ({"points": 10_001}, "points"),
        ({"from_step": "start"}, "from_step"),
        ({"to_step": "1.5"}, "to_step"),
        ({"from_step": 10, "to_step": 9}, "to_step"),
        ({"names": ",".join(f"s{i}" for i in range(51))}, "names"),
        ({"names": "x" * 65}, "names"),
    ],
)
def test_bad_parameters_are_400_naming_the_field(api, running_run, params, field):
    response = api.get(f"/api/runs/{running_run.pk}/metrics/series/", params)

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert list(error["fields"]) == [field]


def test_a_chart_with_names_and_bounds_is_three_queries(
    api, long_run, django_assert_num_queries
):
    api.get("/api/projects/")  # records the token's last use, a write that happens once a minute
    # The token, the run (with its membership check), then the buckets.
    with django_assert_num_queries(3):
        _chart(api, long_run, names="loss,eval", points=500, from_step=0, to_step=STEPS - 1)
    # Raw points cost the same.
    with django_assert_num_queries(3):
        _chart(api, long_run, names="loss", points=500, from_step=0, to_step=100)
    # Missing bounds or names add one read of the coarsest buckets, whatever the run's length.
    with django_assert_num_queries(4):
        _chart(api, long_run, points=500)


def test_another_projects_user_gets_404_and_anonymous_callers_are_refused(
    client_for, make_user, make_project, long_run
):
    stranger = make_user("mallory")
    make_project(owner=stranger)
    url = f"/api/runs/{long_run.pk}/metrics/series/"

    response = client_for(stranger).get(url, {"names": "loss"})
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"

    from rest_framework.test import APIClient

    assert APIClient().get(url).status_code in (401, 403)


def test_a_viewer_of_the_project_may_chart_the_run(client_for, make_user, project, long_run):
    from accounts.models import Membership
    from accounts.services import membership_add

    viewer = make_user("victor")
    membership_add(project=project, user=viewer, role=Membership.Role.VIEWER)

    response = client_for(viewer).get(
        f"/api/runs/{long_run.pk}/metrics/series/", {"names": "loss", "points": 10}
    )
    assert response.status_code == 200
    assert sum(response.json()["series"]["loss"]["count"]) == STEPS
