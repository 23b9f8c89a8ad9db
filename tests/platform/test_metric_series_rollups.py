"""Chart buckets: kept equal to the raw points they summarise, at every resolution."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tandem.contracts import TrainerStepEvent
from telemetry.models import MetricBucket, MetricPoint
from telemetry.services import metric_buckets_rebuild, metric_events_record

from .builders import step_event

REPO_ROOT = Path(__file__).resolve().parents[2]


def _record(run, losses: dict[int, float]) -> None:
    events = [
        TrainerStepEvent.model_validate(step_event(run.pk, step, loss=loss))
        for step, loss in losses.items()
    ]
    metric_events_record(run=run, events=events)


def _bucket(run, resolution: int, start: int, name: str = "loss") -> dict:
    return MetricBucket.objects.filter(
        run=run, name=name, resolution=resolution, bucket_start=start
    ).values("point_count", "value_sum", "value_min", "value_max", "first_step", "last_step")[0]


def _buckets_from_points(run) -> dict[tuple, tuple]:
    """Every bucket the run should have, computed in Python from its raw points."""
    members: dict[tuple, list[tuple[int, float]]] = {}
    for name, step, value in MetricPoint.objects.filter(run=run).values_list(
        "name", "step", "value"
    ):
        for resolution in MetricBucket.BUCKET_RESOLUTIONS:
            key = (name, resolution, step // resolution * resolution)
            members.setdefault(key, []).append((step, value))
    return {
        key: (
            len(points),
            pytest.approx(sum(value for _, value in points), rel=1e-12, abs=1e-12),
            min(value for _, value in points),
            max(value for _, value in points),
            min(step for step, _ in points),
            max(step for step, _ in points),
        )
        for key, points in members.items()
    }


def _stored_buckets(run) -> dict[tuple, tuple]:
    return {
        (name, resolution, start): rest
        for name, resolution, start, *rest in MetricBucket.objects.filter(run=run).values_list(
            "name", "resolution", "bucket_start", "point_count", "value_sum",
            "value_min", "value_max", "first_step", "last_step",
        )
    }


def _assert_buckets_match_points(run) -> None:
    expected, stored = _buckets_from_points(run), _stored_buckets(run)
    assert set(stored) == set(expected)
    for key, row in expected.items():
        assert tuple(stored[key]) == row, key


def test_buckets_hold_count_sum_min_max_and_step_range_of_their_points(running_run):
    _record(running_run, {0: 3.0, 1: 1.0, 2: 4.0, 3: 1.5, 4: 5.0, 5: 9.0})

    # Steps 0-3 and 4-5 at resolution 4, and all six from 16 up.
    assert _bucket(running_run, 4, 0) == {
        "point_count": 4, "value_sum": 9.5, "value_min": 1.0, "value_max": 4.0,
        "first_step": 0, "last_step": 3,
    }
    assert _bucket(running_run, 4, 4) == {
        "point_count": 2, "value_sum": 14.0, "value_min": 5.0, "value_max": 9.0,
        "first_step": 4, "last_step": 5,
    }
    for resolution in MetricBucket.BUCKET_RESOLUTIONS[1:]:
        assert _bucket(running_run, resolution, 0) == {
            "point_count": 6, "value_sum": 23.5, "value_min": 1.0, "value_max": 9.0,
            "first_step": 0, "last_step": 5,
        }
    # Every series of the event is bucketed, not only the loss.
    assert _bucket(running_run, 4, 4, name="reward_mean")["value_sum"] == pytest.approx(0.9)
    _assert_buckets_match_points(running_run)


def test_a_resent_step_recomputes_its_buckets_even_when_it_held_the_minimum_or_maximum(
    running_run,
):
    _record(running_run, {0: 3.0, 1: 1.0, 2: 4.0, 3: 1.5, 4: 5.0, 5: 9.0})

    # A resumed trainer trains steps 1-5 again: the old minimum (step 1) and
    # maximum (step 5) are both replaced by values inside the range.
    _record(running_run, {1: 2.0, 2: 2.5})
    _record(running_run, {5: 6.0})

    assert _bucket(running_run, 4, 0) == {
        "point_count": 4, "value_sum": 9.0, "value_min": 1.5, "value_max": 3.0,
        "first_step": 0, "last_step": 3,
    }
    assert _bucket(running_run, 16, 0) == {
        "point_count": 6, "value_sum": 20.0, "value_min": 1.5, "value_max": 6.0,
        "first_step": 0, "last_step": 5,
    }
    _assert_buckets_match_points(running_run)


def test_resent_steps_over_trainer_http_keep_the_newest_value_in_points_and_buckets(
    trainer_api, running_run
):
    url = f"/api/trainer/runs/{running_run.pk}/telemetry/"
    first = [step_event(running_run.pk, step, loss=10.0 + step) for step in range(8)]
    again = [step_event(running_run.pk, step, loss=-1.0) for step in range(4, 8)]

    for events in (first, again, again):  # the second re-send is a retried post
        response = trainer_api.post(url, {"events": events}, format="json")
        assert response.status_code == 202, response.content

    assert MetricPoint.objects.get(run=running_run, name="loss", step=5).value == -1.0
    assert _bucket(running_run, 4, 4)["value_max"] == -1.0
    assert _bucket(running_run, 16, 0)["value_sum"] == pytest.approx(10 + 11 + 12 + 13 - 4)
    _assert_buckets_match_points(running_run)


def test_scattered_posts_with_gaps_negative_steps_and_resends_match_a_recount(running_run):
    # Posts out of order, far apart (so one post touches distant buckets), with re-sends.
    _record(running_run, {step: float(step % 7) for step in range(0, 70, 3)})
    _record(running_run, {-2: 0.5, 5: 100.0, 70_000: -3.0, 100: 2.0, 16_383: 1.0})
    _record(running_run, {step: -float(step) for step in range(60, 75)})
    _record(running_run, {3: 42.0, 70_000: 3.0})

    _assert_buckets_match_points(running_run)
    # Floor, not truncation: step -2 sits with -4..-1, apart from steps 0..3.
    assert _bucket(running_run, 4, -4)["point_count"] == 1
    assert _bucket(running_run, 65536, 65536)["first_step"] == 70_000


def test_rebuild_writes_the_same_buckets_as_the_write_path(running_run):
    _record(running_run, {step: (step * 37 % 11) / 3 for step in range(0, 300, 2)})
    _record(running_run, {step: 1.25 for step in range(100, 140)})
    written_by_posts = _stored_buckets(running_run)
    MetricBucket.objects.filter(run=running_run).delete()

    written = metric_buckets_rebuild(run=running_run)

    assert written == len(written_by_posts)
    rebuilt = _stored_buckets(running_run)
    assert set(rebuilt) == set(written_by_posts)
    for key, row in rebuilt.items():
        assert row == pytest.approx(written_by_posts[key], rel=1e-12), key


def test_buckets_go_with_their_run(running_run):
    _record(running_run, {0: 1.0, 1: 2.0})
    assert MetricBucket.objects.filter(run=running_run).exists()

    running_run.delete()

    assert not MetricBucket.objects.exists()


SQLITE_SCRIPT = """
import json, django
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from accounts.services import project_create, user_create_with_token
from environment_registry.builtin import CALCULATOR
from environment_registry.services import environment_register
from runs.services import run_create
from tandem.contracts import TrainerStepEvent
from telemetry.models import MetricBucket
from telemetry.selectors import metric_chart
from telemetry.services import metric_events_record

user, _ = user_create_with_token(username="u", password="pw")
project = project_create(owner=user, name="p")
environment_register(user=user, project=project, spec=CALCULATOR)
run = run_create(user=user, project=project, environment_name="calculator", config={}, name="")
def events(losses):
    return [TrainerStepEvent(run_id=run.pk, step=step, phase="rl", policy_version=step, wall_s=1,
            wait_s=0, compute_s=1, publish_s=0, other_s=0, loss=loss, emitted_at=0.0)
            for step, loss in losses]
metric_events_record(run=run, events=events([(step, float(step)) for step in range(-2, 40)]))
metric_events_record(run=run, events=events([(3, -5.0)]))
bucket = MetricBucket.objects.get(run=run, name="loss", resolution=4, bucket_start=0)
chart = metric_chart(run=run, names=["loss"], points=10)
print(json.dumps({
    "bucket": [bucket.point_count, bucket.value_sum, bucket.value_min, bucket.value_max],
    "below_zero": MetricBucket.objects.get(run=run, name="loss", resolution=4, bucket_start=-4)
        .point_count,
    "resolution": chart.resolution,
    "means": chart.series["loss"].mean,
}))
"""


def test_the_embedded_sqlite_default_keeps_buckets_with_the_same_statements(tmp_path):
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'tandem.sqlite3'}",
        "DJANGO_SETTINGS_MODULE": "config.settings.dev",
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "platform")]),
    }
    result = subprocess.run(
        [sys.executable, "-c", SQLITE_SCRIPT], env=env, capture_output=True, text=True,
        timeout=120, cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr

    answer = json.loads(result.stdout.strip().splitlines()[-1])
    assert answer["bucket"] == [4, 0 + 1 + 2 - 5, -5.0, 2.0]
    assert answer["below_zero"] == 2  # steps -2 and -1
    # 42 steps (-2..39) in at least 10 buckets: resolution 4, from the bucket at -4.
    assert answer["resolution"] == 4
    assert answer["means"] == [-1.5, -0.5, 5.5, 9.5, 13.5, 17.5, 21.5, 25.5, 29.5, 33.5, 37.5]


def test_concurrent_posts_for_one_run_both_land_in_the_shared_bucket(transactional_db, running_run):
    import threading

    from django.db import connection, transaction

    first_written, errors = threading.Event(), []

    def first_post():
        try:
            with transaction.atomic():
                _record(running_run, {0: 1.0})
                first_written.set()
                # Hold the transaction open while the second post starts.
                threading.Event().wait(1.0)
        except Exception as error:  # reported by the assertion below
            errors.append(error)
            first_written.set()
        finally:
            connection.close()

    def second_post():
        try:
            _record(running_run, {1: 3.0})  # same bucket of 4 as step 0
        except Exception as error:
            errors.append(error)
        finally:
            connection.close()

    first = threading.Thread(target=first_post)
    first.start()
    assert first_written.wait(10)
    second = threading.Thread(target=second_post)
    second.start()
    first.join(10)
    second.join(10)

    assert errors == []
    bucket = _bucket(running_run, 4, 0)
    assert (bucket["point_count"], bucket["value_sum"]) == (2, 4.0)
    _assert_buckets_match_points(running_run)
