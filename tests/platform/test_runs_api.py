from datetime import timedelta

import pytest
from rest_framework.test import APIClient

from runs.models import Run
from tandem.configs.run import RunConfig


def _create(api, **overrides):
    payload = {"name": "first", "environment": "calculator", "config": {"rl_steps": 7}}
    payload.update(overrides)
    return api.post("/api/runs/", payload, format="json")


def test_creating_a_run_queues_it_with_the_config_defaults_filled_in(api, project, environment):
    response = _create(api, project=project.pk)

    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["status"] == "queued"
    assert body["project"] == project.pk and body["environment"] == "calculator"
    assert body["config"] == RunConfig(rl_steps=7).model_dump(mode="json")
    assert body["urls"]["page"].endswith(f"/runs/{body['id']}/")
    assert body["urls"]["websocket"] == f"ws://testserver/ws/runs/{body['id']}/"
    assert Run.objects.get(pk=body["id"]).config["rl_steps"] == 7


def test_without_a_project_the_users_only_project_is_used(api, project, environment):
    response = _create(api)

    assert response.status_code == 201
    assert response.json()["project"] == project.pk


def test_without_a_project_a_member_of_several_must_name_one(api, environment, make_project, user):
    make_project(owner=user)

    response = _create(api)

    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["project"]


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"rollout": {"group_size": 1}}, "config.rollout.group_size"),
        ({"model": {"num_heads": 0}}, "config.model.num_heads"),
        ({"model": {"d_model": 64, "num_heads": 5}}, "config.model"),
        ({"learning_rate": "fast"}, "config.learning_rate"),
        ({"no_such_setting": 1}, "config.no_such_setting"),
    ],
)
def test_an_invalid_config_is_400_naming_the_field(api, project, environment, config, field):
    response = _create(api, project=project.pk, config=config)

    assert response.status_code == 400
    error = response.json()["error"]
    assert list(error["fields"]) == [field]
    assert error["message"].startswith(f"{field}:")
    assert not Run.objects.exists()


def test_a_config_that_is_not_an_object_is_400_naming_config(api, project, environment):
    response = _create(api, project=project.pk, config=[1])

    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["config"]


def test_an_unknown_environment_is_400_naming_environment(api, project, environment):
    response = _create(api, project=project.pk, environment="chess")

    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["environment"]


def test_an_environment_of_another_project_is_unknown(api, project, make_project, make_environment):
    make_environment(make_project())

    response = _create(api, project=project.pk)

    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["environment"]


def test_a_project_the_user_is_not_a_member_of_is_not_found(api, make_project, make_environment):
    other = make_project()
    make_environment(other)

    response = _create(api, project=other.pk)

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_a_viewer_may_not_start_runs(client_for, make_user, make_project, make_environment):
    viewer = make_user()
    project = make_project(viewers=[viewer])
    make_environment(project)

    response = _create(client_for(viewer), project=project.pk)

    assert response.status_code == 403


def test_the_list_shows_the_users_runs_newest_first(api, project, environment, make_run):
    older = make_run(project, environment=environment)
    newer = make_run(project, environment=environment)
    Run.objects.filter(pk=older.pk).update(created_at=newer.created_at - timedelta(minutes=1))
    make_run()  # someone else's

    body = api.get("/api/runs/").json()

    assert body["count"] == 2
    assert [item["id"] for item in body["results"]] == [newer.pk, older.pk]


def test_the_list_filters_by_status(api, project, environment, make_run):
    queued = make_run(project, environment=environment)
    cancelled = make_run(project, environment=environment)
    api.post(f"/api/runs/{cancelled.pk}/cancel/")

    assert [r["id"] for r in api.get("/api/runs/?status=queued").json()["results"]] == [queued.pk]
    assert [r["id"] for r in api.get("/api/runs/?status=cancelled").json()["results"]] == [
        cancelled.pk
    ]
    response = api.get("/api/runs/?status=sleeping")
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["status"]


def test_the_list_is_paginated(api, project, environment, make_run):
    for _ in range(3):
        make_run(project, environment=environment)

    body = api.get("/api/runs/?page_size=2").json()

    assert body["count"] == 3 and len(body["results"]) == 2 and body["next"]


def test_the_runs_list_makes_the_same_few_queries_however_many_runs(
    project, environment, make_run, make_project, make_environment, user, django_assert_num_queries
):
    client = APIClient()
    client.force_authenticate(user)  # no token lookup, so only the list's own queries count
    other_project = make_project(owner=user)
    other_environment = make_environment(other_project)
    for index in range(6):
        if index % 2:
            make_run(project, environment=environment)
        else:
            make_run(other_project, environment=other_environment)

    # One COUNT for the page, one SELECT joining project and environment, one for the runs' attempts.
    with django_assert_num_queries(3):
        response = client.get("/api/runs/")
    assert len(response.json()["results"]) == 6


def test_showing_a_run(api, project, environment, make_run):
    run = make_run(project, environment=environment, name="shown")

    body = api.get(f"/api/runs/{run.pk}/").json()

    expected_keys = {
        "id", "project", "name", "environment", "environment_version", "status", "status_reason", "config",
        "policy_version", "trainer_step", "attempts", "attempt_history", "restarts", "claimable_after", "stalled_since",
        "heartbeat_at", "created_at", "started_at", "finished_at", "urls", "tags", "notes", "memory_plan", "alerts",
    }  # fmt: skip
    assert set(body) == expected_keys
    assert body["name"] == "shown" and body["status"] == "queued"
    assert body["alerts"] == []  # no rule's condition holds on a run that has not started
    assert body["environment_version"]["number"] == 1
    assert body["environment_version"]["status"] == "ready"


def test_another_users_run_is_not_found(api, make_run):
    run = make_run()

    assert api.get(f"/api/runs/{run.pk}/").status_code == 404
    assert api.post(f"/api/runs/{run.pk}/cancel/").status_code == 404
    assert api.get(f"/api/runs/{run.pk}/metrics/").status_code == 404


def test_cancelling_a_run_and_cancelling_it_again(api, project, environment, make_run):
    run = make_run(project, environment=environment)

    first = api.post(f"/api/runs/{run.pk}/cancel/")
    second = api.post(f"/api/runs/{run.pk}/cancel/")

    assert first.status_code == 200
    assert first.json()["status"] == "cancelled"
    assert first.json()["finished_at"] is not None
    assert second.status_code == 409
    assert second.json()["error"]["code"] == "conflict"


def test_the_run_config_schema_is_published(api):
    schema = api.get("/api/run-config/schema/").json()

    assert "rollout" in schema["properties"] and schema["properties"]["schema_version"]["const"] == 2
