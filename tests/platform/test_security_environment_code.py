"""Finding 1 of the security audit: registering an environment must not run code an operator did not allow.

A ``python`` entrypoint or a ``gymnasium`` factory names a module that workers
import and a callable they call; before the allow-list, ``os:system`` with a
``command`` keyword ran a shell command at the registration probe and again at
every health sweep. Each refused registration is a 400 naming the field and the
setting that would allow it, nothing is stored, and nothing is imported.
"""

from __future__ import annotations

import pytest

from environment_registry.models import Environment
from tests.conftest import UNTRUSTED_MODULE


def _register(api, project, **fields):
    payload = {"project": project.pk, "name": "evil", "kind": "python", "settings": {}} | fields
    return api.post("/api/environments/", payload, format="json")


@pytest.mark.parametrize("entrypoint", [
    "os:system", "subprocess:run", "subprocess:Popen", "builtins:eval",
    f"{UNTRUSTED_MODULE}:UntrustedEnvironment",
    "environments.builtin_evil:Environment",  # a prefix match is by whole package names
])
def test_a_python_entrypoint_outside_the_allowed_modules_is_400_and_never_imported(
    api, project, import_marker, entrypoint
):
    response = _register(api, project, entrypoint=entrypoint)

    assert response.status_code == 400, response.json()
    error = response.json()["error"]
    assert list(error["fields"]) == ["entrypoint"]
    assert "TANDEM_ENVIRONMENT_MODULES" in error["fields"]["entrypoint"][0]
    assert not Environment.objects.filter(name="evil").exists()


@pytest.mark.parametrize("factory", ["os:system", "subprocess:run", "subprocess:Popen",
                                     "builtins:eval", f"{UNTRUSTED_MODULE}:UntrustedEnvironment"])
def test_a_gymnasium_factory_outside_the_allowed_modules_is_400_naming_it(
    api, project, import_marker, tmp_path, factory
):
    command = f"touch {tmp_path / 'pwned'}"
    response = _register(api, project, kind="gymnasium", entrypoint="",
                         settings={"factory": factory, "factory_kwargs": {"command": command}})

    assert response.status_code == 400, response.json()
    error = response.json()["error"]
    assert list(error["fields"]) == ["settings.factory"]
    assert "TANDEM_ENVIRONMENT_MODULES" in error["fields"]["settings.factory"][0]
    assert not (tmp_path / "pwned").exists()


def test_a_python_registration_naming_the_gymnasium_adapter_has_its_factory_checked(
    api, project, tmp_path
):
    command = f"touch {tmp_path / 'pwned'}"
    response = _register(api, project,
                         entrypoint="environments.adapters.gymnasium_text:GymnasiumTextEnvironment",
                         settings={"factory": "os:system", "factory_kwargs": {"command": command}})

    assert response.status_code == 400, response.json()
    assert list(response.json()["error"]["fields"]) == ["settings.factory"]


def test_the_built_ins_and_the_operators_modules_register(api, project):
    builtin = _register(api, project, name="calculator",
                        entrypoint="environments.builtin.calculator:CalculatorEnvironment")
    allowed = _register(api, project, name="team-env",
                        entrypoint="tests.workers.plain_environments:SynchronousStep")

    assert builtin.status_code == 201, builtin.json()
    assert allowed.status_code == 201, allowed.json()


def test_a_deployment_that_refuses_private_addresses_refuses_them_at_registration(api, project, settings):
    settings.TANDEM_ENVIRONMENT_URL_REFUSE_PRIVATE = True
    settings.TANDEM_ENVIRONMENT_URL_ALLOWLIST = None
    for url in ("http://127.0.0.1:6379", "http://10.0.0.5:5432", "http://[::ffff:172.17.0.2]:8000"):
        response = _register(api, project, name="internal", kind="http", entrypoint="",
                             settings={"url": url})
        assert response.status_code == 400, (url, response.json())
        assert list(response.json()["error"]["fields"]) == ["settings.url"]
