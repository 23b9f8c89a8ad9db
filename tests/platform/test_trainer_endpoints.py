import json
from datetime import timedelta

import pytest

from runs.models import Run
from tandem.contracts import TrainerConflictCode
from telemetry.models import MetricPoint

from .builders import POINTS_PER_STEP_EVENT, step_event

CLAIM = "/api/trainer/claim/"


def _heartbeat(run_id: int) -> str:
    return f"/api/trainer/runs/{run_id}/heartbeat/"


def _telemetry(run_id: int) -> str:
    return f"/api/trainer/runs/{run_id}/telemetry/"


def test_a_claim_starts_the_oldest_queued_run(trainer_api, project, environment, make_run):
    newest = make_run(project, environment=environment, name="newest")
    oldest = make_run(project, environment=environment, name="oldest")
    cancelled = make_run(project, environment=environment, name="cancelled-oldest")
    Run.objects.filter(pk=oldest.pk).update(created_at=newest.created_at - timedelta(minutes=5))
    Run.objects.filter(pk=cancelled.pk).update(
        created_at=newest.created_at - timedelta(minutes=10), status="cancelled"
    )

    response = trainer_api.post(CLAIM, {"worker": "gpu-box:4242"}, format="json")

    assert response.status_code == 200, response.content
    claimed = response.json()["run"]
    assert claimed["id"] == oldest.pk and claimed["name"] == "oldest"
    assert claimed["config"] == oldest.config
    version = environment.versions.get()
    assert claimed["environment"] == {
        "schema_version": 6,
        "name": "calculator",
        "version": 1,
        "version_id": version.pk,
        "kind": "python",
        "entrypoint": "environments.builtin.calculator:CalculatorEnvironment",
        "settings": {},
        "tools": version.tools,
        "tool_server": None,
        "secret_setting_names": [],
        "max_concurrent_episodes": None,
    }
    assert claimed["attempts"] == 1
    oldest.refresh_from_db()
    assert oldest.status == "starting" and oldest.claimed_by == "gpu-box:4242"
    assert oldest.started_at is None and oldest.heartbeat_at is not None

    first = trainer_api.post(_heartbeat(oldest.pk), {"worker": "gpu-box:4242"}, format="json")
    assert first.json() == {"schema_version": 1, "status": "running"}
    oldest.refresh_from_db()
    assert oldest.status == "running" and oldest.started_at is not None


def test_claims_take_runs_one_by_one_then_say_there_is_none(
    trainer_api, project, environment, make_run
):
    runs = {make_run(project, environment=environment).pk for _ in range(2)}

    claimed = {
        trainer_api.post(CLAIM, {"worker": f"w:{index}"}, format="json").json()["run"]["id"]
        for index in range(2)
    }
    last = trainer_api.post(CLAIM, {"worker": "w:9"}, format="json")

    assert claimed == runs
    assert last.status_code == 204 and last.content == b""


def test_a_trainer_that_claims_again_gets_back_the_run_it_holds_not_a_second_one(
    trainer_api, project, environment, make_run
):
    """The reply to a claim can be lost after it committed (a timeout, a proxy's 502) and the
    trainer, which retries, asks again: before, that took a second run and left the first starting."""
    first, second = (make_run(project, environment=environment) for _ in range(2))

    claims = [trainer_api.post(CLAIM, {"worker": "w:1"}, format="json").json()["run"] for _ in range(2)]

    assert [claim["id"] for claim in claims] == [first.pk, first.pk]
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.status, first.attempts, second.status) == ("starting", 1, "queued")


def test_a_claim_needs_a_worker_name(trainer_api):
    response = trainer_api.post(CLAIM, {}, format="json")

    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["worker"]


def test_users_who_are_not_staff_may_not_use_the_trainer_endpoints(api, running_run):
    event = step_event(running_run.pk, 1)

    responses = [
        api.post(CLAIM, {"worker": "w:1"}, format="json"),
        api.post(_heartbeat(running_run.pk), {"status": "running"}, format="json"),
        api.post(_telemetry(running_run.pk), {"events": [event]}, format="json"),
    ]

    assert [response.status_code for response in responses] == [403, 403, 403]
    assert all(r.json()["error"]["code"] == "permission_denied" for r in responses)
    running_run.refresh_from_db()
    assert running_run.trainer_step == 0


def test_a_heartbeat_records_progress(trainer_api, running_run):
    response = trainer_api.post(
        _heartbeat(running_run.pk),
        {"status": "running", "policy_version": 3, "trainer_step": 12, "message": "", "worker": "trainer-host:1"},
        format="json",
    )

    assert response.status_code == 200
    assert response.json() == {"schema_version": 1, "status": "running"}
    running_run.refresh_from_db()
    assert (running_run.policy_version, running_run.trainer_step) == (3, 12)


def test_a_finishing_heartbeat_finishes_the_run_with_its_message(trainer_api, running_run):
    response = trainer_api.post(
        _heartbeat(running_run.pk),
        {"status": "failed", "trainer_step": 5, "message": "loss diverged", "worker": "trainer-host:1"},
        format="json",
    )

    assert response.json() == {"schema_version": 1, "status": "failed"}
    running_run.refresh_from_db()
    assert running_run.status == "failed" and running_run.status_reason == "loss diverged"
    assert running_run.finished_at is not None


def test_a_heartbeat_on_a_cancelled_run_reports_cancelled(trainer_api, api, running_run):
    api.post(f"/api/runs/{running_run.pk}/cancel/")

    response = trainer_api.post(
        _heartbeat(running_run.pk), {"status": "running", "trainer_step": 9, "worker": "trainer-host:1"},
        format="json",
    )
    finishing = trainer_api.post(_heartbeat(running_run.pk), {"status": "finished", "worker": "trainer-host:1"},
                                 format="json")

    assert (response.status_code, response.json()) == (200, {"schema_version": 1, "status": "cancelled"})
    assert (finishing.status_code, finishing.json()) == (200, {"schema_version": 1, "status": "cancelled"})
    running_run.refresh_from_db()
    assert running_run.status == "cancelled" and running_run.trainer_step == 0


def test_a_heartbeat_for_a_run_nobody_claimed_is_a_conflict(trainer_api, make_run):
    run = make_run()

    response = trainer_api.post(_heartbeat(run.pk), {"status": "running"}, format="json")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == TrainerConflictCode.RUN_NOT_CLAIMED


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"status": "paused"}, "status"),
        ({"trainer_step": "many"}, "trainer_step"),
        ({"surprise": 1}, "surprise"),
        ({"schema_version": 99}, "non_field_errors"),
    ],
)
def test_a_malformed_heartbeat_is_400_naming_the_field(trainer_api, running_run, body, field):
    response = trainer_api.post(_heartbeat(running_run.pk), body, format="json")

    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == [field]


def test_a_heartbeat_for_a_missing_run_is_not_found(trainer_api, db):
    assert (
        trainer_api.post(_heartbeat(999999), {"status": "running"}, format="json").status_code
        == 404
    )


def test_telemetry_is_stored_as_metric_points_and_moves_the_run_on(trainer_api, running_run):
    events = [step_event(running_run.pk, step) for step in (1, 2, 3)]

    response = trainer_api.post(_telemetry(running_run.pk), {"events": events}, format="json")

    assert response.status_code == 202
    assert response.json() == {"schema_version": 1, "stored": 3 * POINTS_PER_STEP_EVENT, "trace_requests": [],
                               "refused_series": []}
    assert MetricPoint.objects.filter(run=running_run).count() == 3 * POINTS_PER_STEP_EVENT
    point = MetricPoint.objects.get(run=running_run, step=2, name="trainer_idle_fraction")
    assert point.value == pytest.approx(0.25)
    running_run.refresh_from_db()
    assert (running_run.trainer_step, running_run.policy_version) == (3, 3)


def test_a_retried_telemetry_post_stores_nothing_twice(trainer_api, running_run):
    events = [step_event(running_run.pk, step) for step in (1, 2)]

    first = trainer_api.post(_telemetry(running_run.pk), {"events": events}, format="json")
    retry = trainer_api.post(_telemetry(running_run.pk), {"events": events}, format="json")

    assert first.status_code == retry.status_code == 202
    assert first.json() == retry.json()
    assert MetricPoint.objects.filter(run=running_run).count() == 2 * POINTS_PER_STEP_EVENT


def test_non_finite_values_are_accepted_but_not_stored(trainer_api, running_run):
    event = {**step_event(running_run.pk, 1), "loss": float("nan")}
    body = json.dumps({"events": [event]})  # Python writes NaN, as the trainer's client would
    assert "NaN" in body

    response = trainer_api.post(_telemetry(running_run.pk), body, content_type="application/json")

    assert response.status_code == 202
    names = set(MetricPoint.objects.filter(run=running_run).values_list("name", flat=True))
    assert "loss" not in names and "wall_s" in names


def test_telemetry_for_another_run_is_400_naming_the_event(trainer_api, running_run):
    events = [step_event(running_run.pk, 1), step_event(running_run.pk + 1000, 2)]

    response = trainer_api.post(_telemetry(running_run.pk), {"events": events}, format="json")

    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["events.1.run_id"]
    assert not MetricPoint.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "events"),
        ({"events": {"step": 1}}, "events"),
        ({"events": [{"step": 1}]}, "events.0.run_id"),
    ],
)
def test_malformed_telemetry_is_400_naming_the_field(trainer_api, running_run, body, field):
    response = trainer_api.post(_telemetry(running_run.pk), body, format="json")

    assert response.status_code == 400
    assert field in response.json()["error"]["fields"]


def test_telemetry_after_a_cancel_is_kept_but_does_not_move_the_run(trainer_api, api, running_run):
    api.post(f"/api/runs/{running_run.pk}/cancel/")

    response = trainer_api.post(
        _telemetry(running_run.pk), {"events": [step_event(running_run.pk, 4)]}, format="json"
    )

    assert response.status_code == 202
    running_run.refresh_from_db()
    assert running_run.status == "cancelled" and running_run.trainer_step == 0


def test_a_heartbeat_that_does_not_name_the_holder_is_a_conflict(trainer_api, running_run):
    # Finding 6 of the security audit: an empty worker used to skip the holder check.
    for body in ({"status": "running", "trainer_step": 50}, {"status": "running", "worker": "stale-host:9"}):
        response = trainer_api.post(_heartbeat(running_run.pk), body, format="json")
        assert response.status_code == 409
        assert response.json()["error"]["code"] == "run_held_by_another_trainer"
    running_run.refresh_from_db()
    assert running_run.trainer_step == 0
