"""Issue 15, finding 10: write-only secret settings of environments.

Before, an environment's settings were its only keyword arguments, and every viewer of the
project (and every trainer) read them, API keys included. Now a registration may carry
``secret_settings``: stored apart, shown by name only, handed to producers (a Redis key the
platform writes at claim) and probes (the probe request), never to the trainer or a user.
"""

from __future__ import annotations

import pytest
from django.test import Client

from accounts.models import Membership
from accounts.services import membership_add
from environment_registry.models import EnvironmentVersion
from environment_registry.services import environment_probe_record
from runs.services import run_claim_next, run_create, run_transition
from tandem.contracts import (
    EnvironmentSecrets,
    EnvironmentSpec,
    ProbeRequest,
    RunStatus,
    probe_environment_secrets_key,
    probe_request_key,
    run_environment_secrets_key,
)
from tandem.runtime.secrets_at_rest import SecretsCipher, environment_secrets_open
from tests.workers.secret_environments import API_KEY

from .conftest import probe_report

KEYED = {"name": "keyed", "kind": "python", "entrypoint": "tests.workers.secret_environments:KeyedEnvironment",
         "settings": {"greeting": "hi"}}


def _opened(raw: bytes) -> EnvironmentSecrets:
    """A ``tandem:secrets:`` value as a worker reads it (a Fernet token: test_security_secrets_at_rest.py)."""
    return environment_secrets_open(raw, SecretsCipher.from_environment())


def _register(api, **overrides):
    return api.post("/api/environments/", {**KEYED, "secret_settings": {"api_key": API_KEY}, **overrides},
                    format="json")




def test_secret_settings_are_never_returned_to_a_viewer(api, project, make_user, client_for, make_run):
    viewer = make_user("viewer")
    membership_add(project=project, user=viewer, role=Membership.Role.VIEWER)
    registered = _register(api, project=project.pk)
    assert registered.status_code == 201, registered.json()
    environment_id = registered.json()["id"]
    version_id = registered.json()["versions"][0]["id"]
    new_version = api.post(f"/api/environments/{environment_id}/versions/",
                           {**{k: v for k, v in KEYED.items() if k != "name"},
                            "secret_settings": {"api_key": API_KEY}}, format="json")
    assert new_version.status_code == 201, new_version.json()
    run = make_run(project, environment=EnvironmentVersion.objects.get(pk=version_id).environment,
                   config={"sft_steps": 0, "rl_steps": 2})  # keyed has no demonstrations
    viewer_api = client_for(viewer)
    page = Client()
    page.force_login(viewer)
    operator = make_user("operator", is_staff=True)
    operator.is_superuser = True
    operator.save(update_fields=["is_superuser"])
    staff = Client()
    staff.force_login(operator)

    responses = {
        "registration": registered,
        "new version": new_version,
        "list": viewer_api.get("/api/environments/"),
        "detail": viewer_api.get(f"/api/environments/{environment_id}/"),
        "version": viewer_api.get(f"/api/environments/{environment_id}/versions/1/"),
        "run": viewer_api.get(f"/api/runs/{run.pk}/"),
        "environment page": page.get(f"/environments/{environment_id}/"),
        "environment list page": page.get("/environments/"),
        "admin list": staff.get("/admin/environments/environmentversion/"),
        "admin change": staff.get(f"/admin/environments/environmentversion/{version_id}/change/"),
    }

    for what, response in responses.items():
        assert response.status_code in (200, 201), (what, response.status_code)
        assert API_KEY.encode() not in response.content, what
    assert responses["version"].json()["secret_setting_names"] == ["api_key"]
    assert responses["version"].json()["settings"] == {"greeting": "hi"}
    assert b"api_key" in responses["environment page"].content  # the name is shown, not the value


def test_the_trainers_claim_names_the_secret_settings_without_their_values(
    trainer_api, project, keyed_version, django_capture_on_commit_callbacks, redis_client
):
    run_create(user=project.owner, project=project, environment_name="keyed", config={"sft_steps": 0})

    with django_capture_on_commit_callbacks(execute=True):
        response = trainer_api.post("/api/trainer/claim/", {"worker": "gpu-box:1"}, format="json")

    assert response.status_code == 200, response.content
    assert API_KEY.encode() not in response.content
    environment = EnvironmentSpec.model_validate(response.json()["run"]["environment"])
    assert environment.secret_setting_names == ("api_key",) and environment.settings == {"greeting": "hi"}
    redis_client.delete(run_environment_secrets_key(response.json()["run"]["id"]))


def test_a_claim_writes_the_secret_settings_for_producers_and_the_runs_end_deletes_them(
    project, keyed_version, django_capture_on_commit_callbacks, redis_client
):
    run = run_create(user=project.owner, project=project, environment_name="keyed", config={"sft_steps": 0})

    with django_capture_on_commit_callbacks(execute=True):
        run_claim_next(worker="gpu-box:1")
    stored = _opened(redis_client.get(run_environment_secrets_key(run.pk)))
    assert stored.revealed() == {"api_key": API_KEY} and stored.version_id == keyed_version.pk
    assert API_KEY not in repr(stored)  # a log line of the record shows no value

    with django_capture_on_commit_callbacks(execute=True):
        run_transition(run=run, to_status=RunStatus.PAUSED, reason="paused by alice")
    assert redis_client.get(run_environment_secrets_key(run.pk)) is None


def test_a_run_without_secret_settings_writes_no_secrets_key(
    make_run, django_capture_on_commit_callbacks, redis_client
):
    run = make_run()
    with django_capture_on_commit_callbacks(execute=True):
        run_claim_next(worker="gpu-box:1")

    assert redis_client.get(run_environment_secrets_key(run.pk)) is None


def test_a_probe_gets_the_secret_settings_beside_its_request_until_it_is_reported(
    api, project, redis_client, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = _register(api, project=project.pk)
    version = EnvironmentVersion.objects.get(pk=response.json()["versions"][0]["id"])
    probe = version.probes.get()
    request = redis_client.get(probe_request_key(probe.pk))
    secrets = _opened(redis_client.get(probe_environment_secrets_key(probe.pk)))
    assert secrets.revealed() == {"api_key": API_KEY} and secrets.version_id == version.pk
    # The request (and the Celery task, which names only the probe id) holds the names alone.
    assert API_KEY.encode() not in request
    assert ProbeRequest.model_validate_json(request).environment.secret_setting_names == ("api_key",)

    with django_capture_on_commit_callbacks(execute=True):
        environment_probe_record(report=probe_report(probe))

    assert redis_client.get(probe_environment_secrets_key(probe.pk)) is None
    redis_client.delete(probe_request_key(probe.pk))


def test_a_secret_setting_named_like_an_ordinary_one_is_400_naming_it(api, project):
    response = _register(api, project=project.pk, settings={"greeting": "hi", "api_key": "visible"})

    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["secret_settings.api_key"]
    assert API_KEY.encode() not in response.content


@pytest.mark.parametrize(("secret_settings", "field"), [
    ({"api_key": API_KEY * 200}, "secret_settings.api_key"),
    ({"api_key": f"{API_KEY}\u0000"}, "secret_settings.api_key"),
    ({"api_key": [API_KEY]}, "secret_settings.api_key"),
    ({"url": API_KEY}, "secret_settings.url"),
    ({"not-an-identifier": API_KEY}, "secret_settings.not-an-identifier"),
    ({"api_key": ""}, "secret_settings.api_key"),
])
def test_a_refused_secret_setting_is_400_naming_it_without_its_value(api, project, secret_settings, field):
    response = _register(api, project=project.pk, secret_settings=secret_settings)

    assert response.status_code == 400, response.json()
    assert list(response.json()["error"]["fields"]) == [field]
    assert API_KEY.encode() not in response.content


def test_a_new_version_keeps_the_secret_settings_unless_it_sends_its_own(api, project, keyed_version):
    path = f"/api/environments/{keyed_version.environment_id}/versions/"
    body = {k: v for k, v in KEYED.items() if k != "name"}

    kept = api.post(path, body, format="json")
    replaced = api.post(path, {**body, "secret_settings": {"token": "other-secret"}}, format="json")
    clashing_with_kept = api.post(path, {**body, "settings": {"token": "x"}}, format="json")
    dropped = api.post(path, {**body, "secret_settings": {}}, format="json")

    assert [r.status_code for r in (kept, replaced, dropped)] == [201, 201, 201]
    assert kept.json()["secret_setting_names"] == ["api_key"]
    assert replaced.json()["secret_setting_names"] == ["token"]
    assert dropped.json()["secret_setting_names"] == []
    assert clashing_with_kept.status_code == 400
    assert list(clashing_with_kept.json()["error"]["fields"]) == ["secret_settings.token"]
    assert b"other-secret" not in clashing_with_kept.content
    assert "kept from version 3" in clashing_with_kept.json()["error"]["message"]


def test_secret_settings_are_not_carried_over_to_a_version_that_runs_other_code(api, project, keyed_version):
    """Before, a writer could re-point the environment at code of their own and be handed the kept key."""
    path = f"/api/environments/{keyed_version.environment_id}/versions/"
    body = {k: v for k, v in KEYED.items() if k != "name"}
    repointed = {**body, "entrypoint": "tests.workers.secret_environments:SomethingElse"}

    refused = api.post(path, repointed, format="json")

    assert refused.status_code == 400, refused.json()
    assert list(refused.json()["error"]["fields"]) == ["secret_settings"]
    assert "not carried over" in refused.json()["error"]["message"]
    assert API_KEY.encode() not in refused.content
    assert keyed_version.environment.versions.count() == 1
