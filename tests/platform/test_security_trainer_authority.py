"""Finding 6 of the security audit: acting as the trainer takes the trainers' group, not being staff.

Before, any staff user could claim every project's runs and post their
telemetry, trajectories and checkpoints.
"""

from __future__ import annotations

import pytest


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
