"""Runs stored before RunConfig had sections (version 1, flat) keep resuming and cloning.

The platform upgrades each stored config as it reads it and leaves the row as
it was; configs sent without ``schema_version`` (old client scripts) are
upgraded before validation.
"""

from __future__ import annotations

import json

from django.db import connection
from django.test import Client

from runs.models import Run
from tandem.configs.run import RunConfig, upgrade_run_config

# The root of a config as the platform stored it in version 1: flat, every default filled in.
VERSION_1_ROOT = {
    "seed": 0, "learning_rate": 0.003, "rl_learning_rate": 0.0005, "sft_steps": 300, "sft_batch_size": 32,
    "rl_steps": 40, "groups_per_step": 4, "group_size": 8, "groups_per_task": 2, "weight_transport": "redis",
    "weight_dir": None, "pipeline": "async", "rollout_backlog_steps": 2, "max_staleness": 2,
    "rollout_timeout_s": 900.0, "reclaim_idle_ms": 60000, "max_deliveries": 5, "max_new_tokens": 24,
    "max_turns": 3, "environment_timeout_s": 30.0, "max_observation_chars": 8192, "top_p": 1.0, "top_k": 0,
    "stop_strings": [], "inference_slots": None, "decode_chunk_tokens": 8, "temperature": 1.0,
    "checkpoint_every": 20, "checkpoints_kept": 3, "trajectory_samples_per_step": 2,
}


def _version_1(**changes) -> dict:
    defaults = RunConfig().model_dump(mode="json")
    nested = {key: defaults[key] for key in ("lora", "mesh", "algorithm", "model", "optimizer", "schedule")}
    return {**nested, **VERSION_1_ROOT, **changes}


STORED = _version_1(sft_steps=2, rl_steps=2, group_size=4, temperature=0.7, checkpoint_every=5,
                    weight_transport="filesystem", rollout_backlog_steps=3)
# What every reader sees of it.
UPGRADED = RunConfig.model_validate({
    "sft_steps": 2, "rl_steps": 2, "rollout": {"group_size": 4, "backlog_steps": 3},
    # max_new_tokens: the default of version 1's days, stored with the config.
    "sampling": {"temperature": 0.7, "max_new_tokens": 24}, "checkpoint": {"every": 5},
    "weights": {"transport": "filesystem"},
}).model_dump(mode="json")


def _store(run: Run, config: dict) -> None:
    """Write ``config`` into the run's row as it is, past every service."""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {Run._meta.db_table} SET config = %s WHERE id = %s", [json.dumps(config), run.pk])


def _stored(run: Run) -> dict:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT config FROM {Run._meta.db_table} WHERE id = %s", [run.pk])
        (value,) = cursor.fetchone()
    return json.loads(value) if isinstance(value, str) else value


def test_a_run_stored_in_the_flat_shape_resumes_with_its_config_upgraded(api, trainer_api, running_run):
    _store(running_run, STORED)
    Run.objects.filter(pk=running_run.pk).update(status="failed")

    resumed = api.post(f"/api/runs/{running_run.pk}/resume/")
    assert resumed.status_code == 200, resumed.content
    # Read in the current shape; fields added since (say weights.publish_dtype) are left to their
    # defaults, which the trainer's one validation fills in.
    assert resumed.json()["config"] == upgrade_run_config(STORED)
    assert RunConfig.model_validate(resumed.json()["config"]).model_dump(mode="json") == UPGRADED
    claim = trainer_api.post("/api/trainer/claim/", {"worker": "new-host:2"}, format="json")

    run = claim.json()["run"]
    assert (run["id"], run["attempts"]) == (running_run.pk, 2)
    assert run["config"] == upgrade_run_config(STORED)
    # What the trainer does with it: one validation, no error.
    assert RunConfig.model_validate(run["config"]).model_dump(mode="json") == UPGRADED
    # Upgraded on read only: the row keeps the shape it was written in.
    assert _stored(running_run) == STORED


def test_a_run_stored_in_the_flat_shape_clones_with_changes_of_the_current_shape(api, running_run):
    _store(running_run, STORED)

    response = api.post(f"/api/runs/{running_run.pk}/clone/",
                        {"name": "hotter", "config": {"sampling": {"temperature": 1.2}}}, format="json")

    assert response.status_code == 201, response.content
    clone = Run.objects.get(pk=response.json()["id"])
    expected = {**UPGRADED, "sampling": {**UPGRADED["sampling"], "temperature": 1.2}}
    assert response.json()["config"] == expected
    assert _stored(clone) == expected  # a new run is stored in the current shape


def test_flat_changes_of_an_old_client_clone_a_run_stored_in_the_flat_shape(api, running_run):
    _store(running_run, STORED)

    response = api.post(f"/api/runs/{running_run.pk}/clone/", {"config": {"group_size": 6}}, format="json")

    assert response.status_code == 201, response.content
    assert response.json()["config"] == {**UPGRADED, "rollout": {**UPGRADED["rollout"], "group_size": 6}}


def test_a_flat_config_without_a_schema_version_creates_a_run_of_the_current_shape(api, project, environment):
    response = api.post("/api/runs/", {"project": project.pk, "environment": environment.name,
                                       "config": {"group_size": 4, "checkpoints_kept": 2, "rl_steps": 3}},
                        format="json")

    assert response.status_code == 201, response.content
    expected = RunConfig.model_validate({"rl_steps": 3, "rollout": {"group_size": 4}, "checkpoint": {"kept": 2}})
    assert response.json()["config"] == expected.model_dump(mode="json")


def test_a_flat_config_is_refused_naming_the_new_path_of_a_bad_value(api, project, environment):
    response = api.post("/api/runs/", {"project": project.pk, "environment": environment.name,
                                       "config": {"group_size": 1}}, format="json")

    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["config.rollout.group_size"]


def test_the_new_run_form_prefills_a_clone_of_a_run_stored_in_the_flat_shape(user, running_run):
    _store(running_run, STORED)
    browser = Client()
    browser.force_login(user)

    html = browser.get(f"/runs/new/?clone={running_run.pk}").content.decode()

    at = html.index('name="config.sampling.temperature"')
    assert 'value="0.7"' in html[at - 400:at + 400]
