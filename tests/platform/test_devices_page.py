"""The devices page and /api/devices/: every active run of the user's projects, a row per device."""

import time

import pytest

from runs.services import run_claim_next, run_heartbeat, run_transition
from tandem.contracts import (
    ProcessReport,
    ProducerReport,
    TrainerHeartbeat,
    process_reports_key,
    producers_key,
)
from telemetry.selectors import run_list_trainer_held

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
    # As the trainer holding the run (each trainer holds one run at a time).
    trainer_api.credentials(HTTP_AUTHORIZATION=trainer_api._credentials["HTTP_AUTHORIZATION"],
                            HTTP_X_TANDEM_TRAINER=run.claimed_by)
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

    listed = [run.pk for run in run_list_trainer_held(user=user)]

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


PROCESS_HOST = "process-host-devices-page"


@pytest.fixture
def process_reports(redis_client):
    """``write(pid, ...)`` puts a process's report in Redis, as its reporter does; removed afterwards."""
    written: list[str] = []

    def write(pid: int, *, role: str = "rollout_worker", reported_at: float | None = None, **fields):
        reported_at = time.time() if reported_at is None else reported_at
        report = ProcessReport(role=role, hostname=PROCESS_HOST, pid=pid, started_at=reported_at - 3600,
                               reported_at=reported_at, interval_s=5.0, cpu_cores=1.25, rss_bytes=700 * 2**20,
                               host_cpu_count=16, host_cpu_percent=40.0, host_memory_used_bytes=8 * 2**30,
                               host_memory_total_bytes=64 * 2**30, **fields)
        written.append(report.field)
        redis_client.hset(process_reports_key(), report.field, report.model_dump_json())
        return report

    yield write
    if written:
        redis_client.hdel(process_reports_key(), *written)


def _our_processes(body: dict) -> list[dict]:
    return [process for process in body["processes"] if process["hostname"] == PROCESS_HOST]


def test_the_processes_api_lists_every_live_process_naming_only_the_users_runs(
    api, client_for, make_user, make_run, make_project, make_environment, running_run, process_reports,
    redis_client,
):
    stranger_project = make_project(owner=make_user())
    their_run = make_run(stranger_project, environment=make_environment(stranger_project))
    worker = process_reports(311, run_ids=[running_run.pk, their_run.pk], name="rollouts-1@host")
    process_reports(312, role="web")
    dead = process_reports(313, reported_at=time.time() - 60)

    body = api.get("/api/processes/").json()

    processes = _our_processes(body)
    assert [(process["role"], process["pid"]) for process in processes] == [("web", 312), ("rollout_worker", 311)]
    rollout = processes[1]
    assert rollout["runs"] == [{"run": running_run.pk, "url": f"/runs/{running_run.pk}/"}]
    assert rollout["other_runs"] == 1  # the stranger's run is counted, not named
    assert rollout["name"] == "rollouts-1@host"
    assert rollout["uptime_s"] == pytest.approx(3600.0)
    assert (rollout["cpu_cores"], rollout["rss_bytes"], rollout["host_cpu_count"]) == (1.25, 700 * 2**20, 16)
    assert rollout["reported_at"] == worker.reported_at
    # The dead process's report is gone from Redis, not only from the answer.
    assert redis_client.hget(process_reports_key(), dead.field) is None
    # Another user sees the same processes (shared infrastructure) but none of alice's runs by name.
    stranger = next(p for p in _our_processes(client_for(make_user()).get("/api/processes/").json())
                    if p["pid"] == 311)
    assert (stranger["runs"], stranger["other_runs"]) == ([], 2)


def test_the_processes_api_takes_two_queries(api, running_run, process_reports, django_assert_num_queries):
    for pid in range(400, 420):
        process_reports(pid, run_ids=[running_run.pk])
    api.get("/api/processes/")  # records the token's last use, a write that happens once a minute

    # The token with its user, then which of the named runs the user may see, in one query.
    with django_assert_num_queries(2):
        body = api.get("/api/processes/").json()
    assert len(_our_processes(body)) == 20


def test_the_processes_api_says_when_redis_cannot_be_read(api, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    assert api.get("/api/processes/").json() == {"processes": None}


def test_the_page_shows_the_processes(client, user, process_reports):
    process_reports(321, role="trainer")
    client.force_login(user)

    page = client.get("/devices/")

    assert 321 in [process["pid"] for process in _our_processes(page.context["processes"])]
    assert b'id="processes-initial"' in page.content and b'id="processes-root"' in page.content


def _history_runs(page) -> list[tuple[int, bool, bool]]:
    return [(run["id"], run["active"], run["picked"]) for run in page.context["history_runs"]]


def test_the_picker_lists_the_users_runs_newest_first_and_picks_the_newest_active_one(
    client, user, make_run, make_project, make_environment, make_user, project, environment, running_run,
):
    finished = make_run(project, environment=environment, name="finished")
    run_transition(run=finished, to_status="failed", reason="trainer error")
    stranger_project = make_project(owner=make_user())
    their_run = make_run(stranger_project, environment=make_environment(stranger_project), name="not-alices")
    client.force_login(user)

    page = client.get("/devices/")

    # The finished run is newer, but the running one is picked; the stranger's run is not listed.
    assert _history_runs(page) == [(finished.pk, False, False), (running_run.pk, True, True)]
    assert their_run.pk not in [run["id"] for run in page.context["history_runs"]]
    assert page.context["explorer"]["runs"][0]["export_url"] == f"/api/runs/{running_run.pk}/metrics/export/"
    assert b'id="explorer-fixed-panels"' in page.content and b"\xe2\x97\x8f " in page.content  # the active mark


def test_without_an_active_run_the_newest_run_is_picked_and_any_run_can_be_asked_for(
    client, user, make_run, project, environment,
):
    older = make_run(project, environment=environment, name="older")
    newer = make_run(project, environment=environment, name="newer")
    for run in (older, newer):
        run_transition(run=run, to_status="cancelled", reason="by alice")
    client.force_login(user)

    assert _history_runs(client.get("/devices/")) == [(newer.pk, False, True), (older.pk, False, False)]
    assert _history_runs(client.get(f"/devices/?run={older.pk}")) == [(newer.pk, False, False), (older.pk, False, True)]


def test_another_projects_run_in_the_query_string_is_a_404(
    client, user, make_run, make_project, make_environment, make_user, running_run,
):
    stranger_project = make_project(owner=make_user())
    their_run = make_run(stranger_project, environment=make_environment(stranger_project))
    client.force_login(user)

    assert client.get(f"/devices/?run={their_run.pk}").status_code == 404
    assert client.get("/devices/?run=first").status_code == 404


def test_a_user_without_runs_gets_the_page_without_charts(client, make_user):
    client.force_login(make_user())

    page = client.get("/devices/")

    assert page.status_code == 200
    assert page.context["history_runs"] == [] and page.context["explorer"] is None
    assert b'id="metric-explorer"' not in page.content


def test_the_page_takes_the_same_queries_for_any_number_of_runs(
    client, user, make_run, project, environment, running_run, django_assert_num_queries, settings,
):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # no live process listing: its one query depends on Redis
    client.force_login(user)
    client.get("/devices/")
    for index in range(5):
        make_run(project, environment=environment, name=f"more-{index}")

    # Session and user, the trainer-held runs, the picker's runs with their projects, the notifications badge.
    with django_assert_num_queries(5):
        page = client.get("/devices/")
    assert len(page.context["history_runs"]) == 6
