"""Finding 6 of the security audit: acting as the trainer takes the trainers' group, not being staff.

Before, any staff user could claim every project's runs and post their
telemetry, trajectories and checkpoints.
"""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from tandem.contracts import TRAINER_HEADER, TrainerConflictCode


@pytest.mark.parametrize(("method", "path"), [
    ("post", "/api/trainer/claim/"),
    ("post", "/api/trainer/runs/{run}/heartbeat/"),
    ("post", "/api/trainer/runs/{run}/telemetry/"),
    ("post", "/api/trainer/runs/{run}/trajectories/"),
    ("post", "/api/trainer/runs/{run}/checkpoints/"),
])
def test_a_staff_user_who_is_not_a_trainer_is_refused_by_the_trainer_api(
    make_user, client_for, make_run, method, path
):
    staff = make_user("an-administrator", is_staff=True)
    run = make_run()
    response = getattr(client_for(staff), method)(path.format(run=run.pk), {"worker": "x"}, format="json")
    assert response.status_code == 403, response.content


def test_a_user_of_the_trainers_group_may_claim(make_user, client_for, make_run):
    trainer = make_user("a-trainer", password=None, trainer=True)
    run = make_run()
    response = client_for(trainer).post("/api/trainer/claim/", {"worker": "host:1"}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["run"]["id"] == run.pk


# The trainer's writes to a run besides its heartbeats (which name the trainer in their body).
TRAINER_WRITES = [
    ("/api/trainer/runs/{run}/telemetry/", {"events": []}),
    ("/api/trainer/runs/{run}/trajectories/", {"samples": []}),
    ("/api/trainer/runs/{run}/checkpoints/", {"checkpoints": []}),
]


@pytest.mark.parametrize(("path", "body"), TRAINER_WRITES)
def test_a_trainer_presumed_dead_cannot_write_to_the_run_its_successor_holds(
    trainer, make_user, running_run, path, body
):
    """Before, telemetry, trajectory and checkpoint posts never checked the holder: a trainer the
    reaper presumed dead overwrote what the trainer that resumed the run wrote."""
    stale = APIClient()
    stale.credentials(HTTP_AUTHORIZATION=f"Token {trainer.raw_token}", HTTP_X_TANDEM_TRAINER="dead-host:9")
    response = stale.post(path.format(run=running_run.pk), body, format="json")

    assert response.status_code == 409, response.content
    assert response.json()["error"]["code"] == TrainerConflictCode.RUN_HELD_BY_ANOTHER_TRAINER


@pytest.mark.parametrize(("path", "body"), TRAINER_WRITES)
def test_a_trainer_write_that_does_not_name_its_trainer_is_refused_naming_the_header(
    client_for, trainer, running_run, path, body
):
    response = client_for(trainer).post(path.format(run=running_run.pk), body, format="json")

    assert response.status_code == 400, response.content
    assert list(response.json()["error"]["fields"]) == [TRAINER_HEADER]


@pytest.mark.parametrize(("path", "body"), TRAINER_WRITES)
def test_a_trainer_cannot_write_to_a_run_no_trainer_holds(trainer_api, make_run, path, body):
    queued = make_run()

    response = trainer_api.post(path.format(run=queued.pk), body, format="json")

    assert response.status_code == 409, response.content
    assert response.json()["error"]["code"] == TrainerConflictCode.RUN_NOT_CLAIMED


@pytest.mark.parametrize(("path", "body"), TRAINER_WRITES)
def test_the_trainer_holding_the_run_writes_to_it(trainer_api, running_run, path, body):
    response = trainer_api.post(path.format(run=running_run.pk), body, format="json")

    assert response.status_code in (200, 202), response.content
