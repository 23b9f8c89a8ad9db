"""Input the contracts allow but the database cannot store is a 400 naming the field, never a 500.

Found by fuzzing: 2**40 as a step or version (PostgreSQL `integer` holds 32 bits),
and NUL characters, which neither text nor jsonb can hold.
"""

import pytest

from runs.models import Run

from .builders import step_event

BIG = 2**40


def _error_fields(response) -> list[str]:
    assert response.status_code == 400, (response.status_code, response.content[:300])
    return list(response.json()["error"]["fields"])


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"policy_version": BIG}, "policy_version"),
        ({"trainer_step": BIG}, "trainer_step"),
        ({"status": "failed", "message": "oom\x00"}, "message"),
    ],
)
def test_a_heartbeat_the_database_cannot_store(trainer_api, running_run, body, field):
    response = trainer_api.post(
        f"/api/trainer/runs/{running_run.pk}/heartbeat/", body, format="json"
    )

    assert _error_fields(response) == [field]
    running_run.refresh_from_db()
    assert running_run.status == "running" and running_run.policy_version < BIG


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"step": BIG}, "events.0.step"),
        ({"policy_version": BIG}, "events.0.policy_version"),
        # A series name the database cannot store is refused alone, the post kept:
        # tests/platform/test_telemetry_series_refusals.py.
    ],
)
def test_telemetry_the_database_cannot_store(trainer_api, running_run, overrides, field):
    overrides = dict(overrides)
    event = step_event(running_run.pk, overrides.pop("step", 1), **overrides)

    response = trainer_api.post(
        f"/api/trainer/runs/{running_run.pk}/telemetry/", {"events": [event]}, format="json"
    )

    assert _error_fields(response) == [field]
    assert not running_run.metric_points.exists()


def test_environment_settings_with_a_nul_character(api, project):
    body = {
        "project": project.pk,
        "name": "nul",
        "entrypoint": "tests.workers.other:C",
        "settings": {"deep": [{"key": "a\x00b"}]},
    }

    assert _error_fields(api.post("/api/environments/", body, format="json")) == [
        "settings.deep.0.key"
    ]


def test_a_run_config_with_a_nul_character(api, project, environment):
    body = {"project": project.pk, "environment": "calculator", "config": {"note\x00": 1}}

    assert _error_fields(api.post("/api/runs/", body, format="json")) == ["config.note\x00"]
    assert not Run.objects.exists()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/projects/", {"name": "a\x00"}),
        ("/api/tokens/", {"name": "a\x00"}),
    ],
)
def test_names_with_a_nul_character(api, path, body):
    assert _error_fields(api.post(path, body, format="json")) == ["name"]


def test_huge_numbers_in_queries_are_answered(api, running_run):
    assert api.get(f"/api/runs/{running_run.pk}/metrics/?after_step={BIG}").status_code == 200
    assert api.get(f"/api/runs/?project={BIG}").status_code == 404
    assert api.get("/api/runs/?page=" + "9" * 30).status_code == 404  # past the last page
    assert _error_fields(api.get("/api/runs/?page=0")) == ["page"]
    assert _error_fields(api.get("/api/runs/?page=two")) == ["page"]


def test_a_data_error_no_check_caught_is_still_a_400_in_the_one_shape():
    from django.db import DataError

    from common.exception_handler import api_exception_handler

    response = api_exception_handler(DataError("integer out of range\nCONTEXT: ..."), {})

    assert response.status_code == 400
    assert response.data["error"]["code"] == "invalid"
    assert response.data["error"]["message"].endswith("integer out of range")
