"""Pausing, resuming, cloning, and the reaper of runs whose trainer died (real PostgreSQL and Redis)."""

from datetime import timedelta

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from runs.models import Run
from runs.services import run_claim_next, run_reap_dead_trainers
from runs.tasks import reap_dead_trainers
from tandem.contracts import TrainerConflictCode, run_stop_key
from tests.platform.conftest import TRAINER_NAME


def _heartbeat(run_id: int) -> str:
    return f"/api/trainer/runs/{run_id}/heartbeat/"


@pytest.fixture
def producers_redis():
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        client.ping()
    except redis.ConnectionError as exc:
        pytest.fail(f"these tests need Redis at {settings.REDIS_URL}: {exc}")
    yield client
    client.close()


def _silence(run: Run, seconds: float) -> None:
    Run.objects.filter(pk=run.pk).update(heartbeat_at=timezone.now() - timedelta(seconds=seconds))


@pytest.mark.django_db(transaction=True)
def test_the_reaper_fails_only_runs_whose_trainer_went_silent_and_stops_their_producers(
    running_run, make_run, project, environment, producers_redis
):
    # No restarts left: the reaper fails it (see the restart tests below for the rest).
    Run.objects.filter(pk=running_run.pk).update(config={**running_run.config, "max_restarts": 0})
    producers_redis.delete(run_stop_key(running_run.pk))
    alive = make_run(project, environment=environment)
    run_claim_next(worker="other-host:7")
    queued = make_run(project, environment=environment)
    _silence(running_run, 120)
    _silence(alive, 5)

    reaped = run_reap_dead_trainers(heartbeat_timeout_s=60)

    assert [run.pk for run in reaped] == [running_run.pk]
    running_run.refresh_from_db()
    assert running_run.status == "failed"
    assert "trainer-host:1 sent no heartbeat since" in running_run.status_reason
    assert "timeout 60 s" in running_run.status_reason
    assert "no restarts left (config.max_restarts=0)" in running_run.status_reason
    assert producers_redis.get(run_stop_key(running_run.pk)) == b"1"
    assert Run.objects.get(pk=alive.pk).status == "starting"
    assert Run.objects.get(pk=queued.pk).status == "queued"
    # A second pass finds nothing more to do.
    assert run_reap_dead_trainers(heartbeat_timeout_s=60) == []


def test_a_run_whose_trainer_died_is_queued_again_up_to_max_restarts_then_fails(running_run):
    """Before, the reaper failed it 60 s later and it waited for someone to resume it by hand."""
    Run.objects.filter(pk=running_run.pk).update(config={**running_run.config, "max_restarts": 2})
    for restart, trainer in ((1, "second-host:2"), (2, "third-host:3")):
        _silence(running_run, 120)
        assert [run.pk for run in run_reap_dead_trainers(heartbeat_timeout_s=60)] == [running_run.pk]
        running_run.refresh_from_db()
        assert (running_run.status, running_run.restarts, running_run.claimed_by) == ("queued", restart, "")
        assert f"restart {restart} of 2" in running_run.status_reason
        # The next trainer's claim resumes it: attempts past 1 continue from the checkpoint.
        claimed = run_claim_next(worker=trainer)
        assert claimed.pk == running_run.pk and claimed.attempts == restart + 1
    _silence(running_run, 120)
    run_reap_dead_trainers(heartbeat_timeout_s=60)
    running_run.refresh_from_db()
    assert running_run.status == "failed" and "no restarts left (config.max_restarts=2)" in running_run.status_reason
    # The run's page and API show each attempt: who held it, and how it ended.
    history = [(a.number, a.trainer, a.outcome) for a in running_run.attempt_history.order_by("number")]
    assert history == [(1, "trainer-host:1", "queued"), (2, "second-host:2", "queued"), (3, "third-host:3", "failed")]
    assert all("sent no heartbeat since" in a.reason for a in running_run.attempt_history.all())


def test_a_trainer_that_lost_a_process_gives_the_run_back_as_a_restart_up_to_max_restarts(trainer_api, running_run):
    """A multi-process trainer whose follower died says "queued" (before, it could only fail the run):
    a restart, counted as the reaper counts one, and past max_restarts a failure saying why."""
    Run.objects.filter(pk=running_run.pk).update(config={**running_run.config, "max_restarts": 1})
    lost = "lost a process of its JAX job (JaxRuntimeError: Gloo all-reduce failed: Connection closed by peer)"

    given_back = trainer_api.post(_heartbeat(running_run.pk), {"worker": TRAINER_NAME, "status": "queued",
                                                              "message": lost, "trainer_step": 7}, format="json")

    assert given_back.status_code == 200, given_back.content
    assert given_back.json()["status"] == "queued"
    running_run.refresh_from_db()
    assert (running_run.status, running_run.restarts, running_run.claimed_by) == ("queued", 1, "")
    assert running_run.status_reason.startswith(f"Trainer {TRAINER_NAME} {lost}; restart 1 of 1: queued again")
    # The next claim resumes it; a second loss is past max_restarts.
    claimed = run_claim_next(worker=TRAINER_NAME)
    assert claimed.pk == running_run.pk and claimed.attempts == 2
    trainer_api.post(_heartbeat(running_run.pk), {"worker": TRAINER_NAME, "status": "queued", "message": lost},
                     format="json")
    running_run.refresh_from_db()
    assert (running_run.status, running_run.restarts) == ("failed", 1)
    assert lost in running_run.status_reason and "no restarts left (config.max_restarts=1)" in running_run.status_reason
    assert [(a.number, a.outcome) for a in running_run.attempt_history.order_by("number")] == [
        (1, "queued"), (2, "failed")]


SET_ASIDE = ("set the run aside for 60 s: PlatformRequestFailedError: the platform answered GET "
             "http://platform/api/trainer/runs/1/datasets/broken/versions/1/rows/ with HTTP 500 on all 3 tries: "
             "Server Error (500)")


def test_a_run_set_aside_is_claimed_only_after_its_wait_and_other_projects_runs_are_claimed_meanwhile(
    trainer_api, api, running_run, make_run
):
    """A trainer that gives a run back with retry_after_s (the platform kept failing a read of its data)
    gets other runs first, and that run once the wait is over; past max_restarts it fails, saying why."""
    Run.objects.filter(pk=running_run.pk).update(config={**running_run.config, "max_restarts": 1})
    other_project_run = make_run()  # newer: before, the claim always took the stuck run again first
    before = timezone.now()

    given_back = trainer_api.post(_heartbeat(running_run.pk), {
        "worker": TRAINER_NAME, "status": "queued", "message": SET_ASIDE, "retry_after_s": 60}, format="json")

    assert given_back.status_code == 200, given_back.content
    running_run.refresh_from_db()
    assert (running_run.status, running_run.restarts, running_run.claimed_by) == ("queued", 1, "")
    claimable_after = running_run.claimable_after
    assert before + timedelta(seconds=60) <= claimable_after <= timezone.now() + timedelta(seconds=60)
    assert running_run.status_reason.startswith(f"Trainer {TRAINER_NAME} {SET_ASIDE}; restart 1 of 1: queued again, "
                                                f"claimable from {claimable_after:%Y-%m-%d %H:%M:%S} UTC")
    shown = api.get(f"/api/runs/{running_run.pk}/").json()
    assert shown["claimable_after"] == claimable_after.isoformat().replace("+00:00", "Z")

    a_second_early = claimable_after - timedelta(seconds=1)
    assert run_claim_next(worker="trainer-b:2", now=a_second_early).pk == other_project_run.pk
    assert run_claim_next(worker="trainer-c:3", now=a_second_early) is None
    claimed = run_claim_next(worker=TRAINER_NAME, now=claimable_after)
    assert (claimed.pk, claimed.attempts, claimed.claimable_after) == (running_run.pk, 2, None)

    # Set aside again: no restarts left, so it fails with the trainer's reason, and waits for no one.
    trainer_api.post(_heartbeat(running_run.pk), {
        "worker": TRAINER_NAME, "status": "queued", "message": SET_ASIDE, "retry_after_s": 60}, format="json")
    running_run.refresh_from_db()
    assert (running_run.status, running_run.restarts, running_run.claimable_after) == ("failed", 1, None)
    assert running_run.status_reason == (f"Trainer {TRAINER_NAME} {SET_ASIDE}; no restarts left "
                                         "(config.max_restarts=1): resume the run to continue from its last checkpoint.")
    assert [(a.number, a.outcome) for a in running_run.attempt_history.order_by("number")] == [
        (1, "queued"), (2, "failed")]


def test_a_run_set_aside_and_then_cancelled_stays_cancelled_and_is_never_claimed(trainer_api, api, running_run):
    trainer_api.post(_heartbeat(running_run.pk), {
        "worker": TRAINER_NAME, "status": "queued", "message": SET_ASIDE, "retry_after_s": 60}, format="json")

    assert api.post(f"/api/runs/{running_run.pk}/cancel/").status_code == 200
    assert run_claim_next(worker=TRAINER_NAME, now=timezone.now() + timedelta(days=2)) is None
    running_run.refresh_from_db()
    assert running_run.status == "cancelled"


@pytest.mark.parametrize("retry_after_s", [-1, 86_401, "soon"])
def test_a_heartbeat_with_a_retry_after_out_of_bounds_is_refused_naming_the_field(
    trainer_api, running_run, retry_after_s
):
    refused = trainer_api.post(_heartbeat(running_run.pk), {
        "worker": TRAINER_NAME, "status": "queued", "retry_after_s": retry_after_s}, format="json")

    assert refused.status_code == 400, refused.content
    assert "retry_after_s" in refused.content.decode()
    running_run.refresh_from_db()
    assert (running_run.status, running_run.restarts) == ("running", 0)


def test_the_attempts_show_in_the_api_and_on_the_run_page(api, running_run):
    _silence(running_run, 120)
    run_reap_dead_trainers(heartbeat_timeout_s=60)
    run_claim_next(worker="second-host:2")

    body = api.get(f"/api/runs/{running_run.pk}/").json()
    assert body["restarts"] == 1
    assert [(a["number"], a["trainer"], a["outcome"]) for a in body["attempt_history"]] == [
        (1, "trainer-host:1", "queued"), (2, "second-host:2", "")]
    api.force_login(running_run.project.memberships.first().user)
    page = api.get(f"/runs/{running_run.pk}/").content.decode()
    assert 'data-attempt="2"' in page and "second-host:2" in page and "1 restart by the platform" in page


@pytest.mark.django_db(transaction=True)
def test_the_beat_task_reaps_with_the_configured_timeout(running_run, settings):
    settings.TANDEM_TRAINER_HEARTBEAT_TIMEOUT_S = 30
    _silence(running_run, 20)
    assert reap_dead_trainers() == []
    _silence(running_run, 40)
    assert reap_dead_trainers() == [running_run.pk]


def test_pause_then_resume_queues_the_run_for_a_trainer_that_resumes_it(api, trainer_api, running_run):
    paused = api.post(f"/api/runs/{running_run.pk}/pause/")
    assert paused.status_code == 200, paused.content
    assert paused.json()["status"] == "paused"

    # The trainer learns of the pause at its next heartbeat.
    beat = trainer_api.post(_heartbeat(running_run.pk), {"worker": "trainer-host:1"}, format="json")
    assert beat.json() == {"schema_version": 1, "status": "paused"}

    resumed = api.post(f"/api/runs/{running_run.pk}/resume/")
    assert resumed.status_code == 200, resumed.content
    assert resumed.json()["status"] == "queued"

    claim = trainer_api.post("/api/trainer/claim/", {"worker": "new-host:2"}, format="json")
    assert claim.json()["run"]["id"] == running_run.pk
    assert claim.json()["run"]["attempts"] == 2
    running_run.refresh_from_db()
    assert running_run.status == "starting" and running_run.claimed_by == "new-host:2"


def test_a_failed_run_can_be_resumed_but_a_finished_one_cannot(api, trainer_api, running_run, make_run,
                                                                project, environment):
    trainer_api.post(_heartbeat(running_run.pk), {"status": "failed", "message": "boom",
                                                  "worker": "trainer-host:1"}, format="json")
    assert api.post(f"/api/runs/{running_run.pk}/resume/").json()["status"] == "queued"
    assert Run.objects.get(pk=running_run.pk).finished_at is None

    finished = make_run(project, environment=environment)
    Run.objects.filter(pk=finished.pk).update(status="finished")
    refused = api.post(f"/api/runs/{finished.pk}/resume/")
    assert refused.status_code == 409
    assert refused.json()["error"]["message"] == f"Run {finished.pk} is finished; it cannot become queued."


def test_a_queued_run_cannot_be_paused(api, make_run, project, environment):
    run = make_run(project, environment=environment)
    response = api.post(f"/api/runs/{run.pk}/pause/")
    assert response.status_code == 409
    assert Run.objects.get(pk=run.pk).status == "queued"


def test_a_trainer_that_lost_its_run_to_another_is_told_so(api, trainer_api, running_run):
    Run.objects.filter(pk=running_run.pk).update(status="failed")
    api.post(f"/api/runs/{running_run.pk}/resume/")
    trainer_api.post("/api/trainer/claim/", {"worker": "new-host:2"}, format="json")

    zombie = trainer_api.post(_heartbeat(running_run.pk), {"worker": "trainer-host:1", "trainer_step": 99},
                              format="json")

    assert zombie.status_code == 409
    error = zombie.json()["error"]
    # The trainer acts on the code; the message is for the people reading its log.
    assert error["code"] == TrainerConflictCode.RUN_HELD_BY_ANOTHER_TRAINER
    assert "held by trainer new-host:2, not trainer-host:1" in error["message"]
    running_run.refresh_from_db()
    assert running_run.trainer_step != 99


def test_clone_changes_only_what_it_is_told(api, running_run):
    original = running_run.config
    response = api.post(f"/api/runs/{running_run.pk}/clone/",
                        {"name": "lower lr", "config": {"learning_rate": 0.0005,
                                                        "algorithm": {"epsilon_high": 0.3}}},
                        format="json")

    assert response.status_code == 201, response.content
    clone = response.json()
    assert clone["status"] == "queued" and clone["name"] == "lower lr" and clone["id"] != running_run.pk
    assert clone["environment"] == running_run.environment.name
    assert clone["config"]["learning_rate"] == 0.0005
    assert clone["config"]["algorithm"]["epsilon_high"] == 0.3
    differing = {key for key in original if original[key] != clone["config"][key]}
    assert differing == {"learning_rate", "algorithm"}
    assert {key for key in original["algorithm"]
            if original["algorithm"][key] != clone["config"]["algorithm"][key]} == {"epsilon_high"}


def test_a_clone_with_a_bad_change_is_400_naming_the_field(api, running_run):
    response = api.post(f"/api/runs/{running_run.pk}/clone/", {"config": {"rollout": {"group_size": 0}}}, format="json")
    assert response.status_code == 400
    assert "config.rollout.group_size" in response.json()["error"]["fields"]


def test_another_projects_user_can_neither_pause_resume_nor_clone(client_for, make_user, running_run):
    stranger = client_for(make_user("mallory"))
    for action in ("pause", "resume", "clone"):
        assert stranger.post(f"/api/runs/{running_run.pk}/{action}/", {}, format="json").status_code == 404
    assert Run.objects.get(pk=running_run.pk).status == "running"


def test_a_liveness_heartbeat_refreshes_the_run_without_moving_it(trainer_api, make_run, project, environment):
    run = make_run(project, environment=environment)
    run_claim_next(worker="slow-compile:3")
    _silence(run, 50)

    beat = trainer_api.post(_heartbeat(run.pk), {"status": None, "worker": "slow-compile:3"}, format="json")

    assert beat.json() == {"schema_version": 1, "status": "starting"}
    run.refresh_from_db()
    assert run.status == "starting"
    assert timezone.now() - run.heartbeat_at < timedelta(seconds=5)
    assert run_reap_dead_trainers(heartbeat_timeout_s=30) == []


def test_a_user_cannot_resume_a_run_a_trainer_holds(api, running_run):
    """Queued from running is the reaper's restart only: a user's resume would take the run from a live trainer."""
    response = api.post(f"/api/runs/{running_run.pk}/resume/")

    assert response.status_code == 409, response.content
    assert "only a paused or failed run can be resumed" in response.json()["error"]["message"]
    running_run.refresh_from_db()
    assert running_run.status == "running" and running_run.claimed_by == "trainer-host:1"
