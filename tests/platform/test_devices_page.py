"""The devices page and /api/devices/: every active run of the user's projects, a row per device."""

import time

import pytest

from runs.services import run_claim_next, run_heartbeat, run_transition
from tandem.contracts import ProducerReport, TrainerHeartbeat, producers_key
from telemetry.selectors import device_snapshot_list_active

from .builders import device_report, step_event


@pytest.fixture
def clean_producer_keys(redis_client):
    """Producer reports of the runs a test makes start and end empty (run ids repeat across test databases)."""
    used: list[int] = []

    def clean(run_id: int) -> None:
        used.append(run_id)
        redis_client.delete(producers_key(run_id))

    yield clean
    for run_id in used:
        redis_client.delete(producers_key(run_id))


def _post_report(trainer_api, run, step: int = 3, **report) -> None:
    response = trainer_api.post(f"/api/trainer/runs/{run.pk}/telemetry/",
                                {"events": [step_event(run.pk, step, device=device_report(**report))]},
                                format="json")
    assert response.status_code == 202, response.content


@pytest.fixture
def second_running_run(make_run, project, environment, running_run):
    run = make_run(project, environment=environment, name="second")
    claimed = run_claim_next(worker="trainer-host:2")
    assert claimed.pk == run.pk
    return run_heartbeat(run=claimed, heartbeat=TrainerHeartbeat(worker="trainer-host:2"))


def test_only_active_runs_of_the_users_projects_are_listed(
    user, running_run, second_running_run, make_run, make_project, make_environment, make_user, project,
    environment,
):
    stranger_project = make_project(owner=make_user())
    their_run = make_run(stranger_project, environment=make_environment(stranger_project))
    assert run_claim_next(worker="trainer-host:3").pk == their_run.pk  # a trainer holds it: active, not alice's
    queued = make_run(project, environment=environment, name="queued")  # no trainer holds it yet
    run_transition(run=second_running_run, to_status="finished")

    listed = [run.pk for run in device_snapshot_list_active(user=user)]

    assert listed == [running_run.pk]
    assert {their_run.pk, queued.pk, second_running_run.pk}.isdisjoint(listed)


def test_the_api_gives_a_row_per_device_and_leaves_out_other_users_runs(
    api, trainer_api, client_for, make_user, running_run, clean_producer_keys,
):
    clean_producer_keys(running_run.pk)
    _post_report(trainer_api, running_run)

    body = api.get("/api/devices/").json()

    assert [entry["run"] for entry in body] == [running_run.pk]
    entry = body[0]
    assert (entry["step"], entry["url"], entry["status"]) == (3, f"/runs/{running_run.pk}/", "running")
    assert [device["id"] for device in entry["report"]["devices"]] == [0, 1, 2, 3]
    assert entry["report"]["devices"][2]["memory_in_use_bytes"] == 12 * 2**30
    assert entry["producers"] == []
    assert client_for(make_user()).get("/api/devices/").json() == []


def test_a_run_without_a_report_yet_is_listed_with_none(api, running_run, clean_producer_keys):
    clean_producer_keys(running_run.pk)
    (entry,) = api.get("/api/devices/").json()
    assert (entry["run"], entry["report"], entry["step"]) == (running_run.pk, None, None)


def test_producer_processes_come_from_their_reports_in_redis(
    api, trainer_api, running_run, redis_client, clean_producer_keys,
):
    clean_producer_keys(running_run.pk)
    report = ProducerReport(worker="rollouts-1:77", reported_at=time.time(), uptime_s=30.0, busy_s=20.0,
                            running_tasks=2, cpu_s=12.5, rss_bytes=900 * 2**20)
    redis_client.hset(producers_key(running_run.pk), report.worker, report.model_dump_json())
    redis_client.hset(producers_key(running_run.pk), "from-the-future", '{"schema_version": 99}')

    (entry,) = api.get("/api/devices/").json()

    assert entry["producers"] == [{"worker": "rollouts-1:77", "reported_at": report.reported_at,
                                   "running_tasks": 2, "uptime_s": 30.0, "cpu_s": 12.5,
                                   "rss_bytes": 900 * 2**20}]


def test_the_list_takes_the_same_queries_for_any_number_of_runs(
    api, trainer_api, running_run, second_running_run, clean_producer_keys, django_assert_num_queries,
):
    for run in (running_run, second_running_run):
        clean_producer_keys(run.pk)
        _post_report(trainer_api, run)
    api.get("/api/devices/")  # records the token's last use, a write that happens once a minute

    # The token with its user, then the runs with their projects and snapshots in one query.
    with django_assert_num_queries(2):
        body = api.get("/api/devices/").json()
    assert len(body) == 2


def test_the_page_shows_the_users_active_runs(client, user, make_user, trainer_api, running_run,
                                               clean_producer_keys):
    clean_producer_keys(running_run.pk)
    _post_report(trainer_api, running_run)
    client.force_login(user)

    page = client.get("/devices/")

    assert page.status_code == 200
    assert page.context["active_runs"][0]["run"] == running_run.pk
    assert len(page.context["active_runs"][0]["report"]["devices"]) == 4
    assert b'id="devices-initial"' in page.content and b"gpu-host-1" in page.content
    client.force_login(make_user())
    assert client.get("/devices/").context["active_runs"] == []


def test_the_page_needs_a_login(client):
    response = client.get("/devices/")
    assert response.status_code == 302 and "/login/" in response["Location"]
