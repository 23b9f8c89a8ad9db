"""Finding 1 of the security audit, on the worker: a registration the platform would now refuse,
already stored or sent straight to a worker, still imports and calls nothing outside the allowed modules.

Probes and producers (of episodes and of SFT demonstrations; the trainer loads none) all load
environments through ``load_environment_class``; the gymnasium adapter checks its factory itself.
"""

from __future__ import annotations

import pytest

from environments import EnvironmentLoadError, load_environment_class
from environments.adapters.gymnasium_text import GymnasiumTextEnvironment
from tandem.allowlists.environment_modules import (
    EnvironmentModuleRefused,
    allowed_environment_modules,
    check_environment_target,
)
from tandem.contracts import EnvironmentSpec, ProbeRequest, ProbeTimeouts
from tests.conftest import UNTRUSTED_MODULE
from workers.probe import run_probe

FAST = ProbeTimeouts(url=5, load=10, reset=1.5, tools=1.5, step=1.5, close=1.5)


REFUSED = ["os:system", "subprocess:run", "subprocess:Popen", "builtins:eval",
           f"{UNTRUSTED_MODULE}:UntrustedEnvironment"]


@pytest.mark.parametrize("entrypoint", REFUSED)
def test_loading_a_python_environment_outside_the_allowed_modules_imports_nothing(
    import_marker, entrypoint
):
    with pytest.raises(EnvironmentLoadError, match="TANDEM_ENVIRONMENT_MODULES"):
        load_environment_class(EnvironmentSpec(name="evil", kind="python", entrypoint=entrypoint))


@pytest.mark.parametrize("factory", REFUSED)
def test_a_gymnasium_factory_outside_the_allowed_modules_is_never_called(
    import_marker, tmp_path, factory
):
    command = f"touch {tmp_path / 'pwned'}"
    with pytest.raises(ValueError, match="settings.factory: .*TANDEM_ENVIRONMENT_MODULES"):
        GymnasiumTextEnvironment(factory=factory, factory_kwargs={"command": command})
    assert not (tmp_path / "pwned").exists()


def test_the_probe_of_a_stored_os_system_registration_fails_its_load_and_runs_nothing(tmp_path):
    # What the health sweep re-ran every minute before the fix.
    command = f"touch {tmp_path / 'pwned'}"
    spec = EnvironmentSpec(name="evil", kind="gymnasium",
                           settings={"factory": "os:system", "factory_kwargs": {"command": command}})
    report = run_probe(ProbeRequest(probe_id=1, purpose="health", environment=spec, timeouts=FAST))

    load = next(check for check in report.checks if check.name == "load")
    assert load.status == "failed" and "TANDEM_ENVIRONMENT_MODULES" in load.message
    assert not report.passed
    assert not (tmp_path / "pwned").exists()


def test_module_prefixes_match_whole_package_names():
    allowed = allowed_environment_modules("my_team.envs, other")
    assert allowed == ("environments.builtin", "my_team.envs", "other")
    assert check_environment_target("my_team.envs:Env", allowed=allowed) == "my_team.envs"
    assert check_environment_target("my_team.envs.maze:Maze", allowed=allowed) == "my_team.envs.maze"
    for refused in ("my_team.envs_other:Env", "my_team:Env", "my_team.envs:", "my_team.envs:a.b",
                    "../x:Env", "environments.adapters.http:Helper"):
        with pytest.raises(EnvironmentModuleRefused):
            check_environment_target(refused, allowed=allowed)
    with pytest.raises(ValueError, match="not a dotted module name"):
        allowed_environment_modules("ok, not-a-module")
