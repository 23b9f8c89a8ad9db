import io
import json

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.core.management import CommandError, call_command

from accounts.models import Membership
from accounts.selectors import api_token_authenticate, user_is_trainer
from environment_registry.builtin import BUILTIN_ENVIRONMENTS
from environment_registry.models import Environment, EnvironmentVersion

ARGS = [
    "--username",
    "demo",
    "--password",
    "demo",
    "--project",
    "demo",
    "--trainer-username",
    "tandem-trainer",
]


def _bootstrap(capsys, *args: str) -> dict:
    out = io.StringIO()
    call_command("tandem_bootstrap", *(args or ARGS), stdout=out, stderr=io.StringIO())
    assert capsys.readouterr().out == ""  # nothing but the command's own line
    lines = out.getvalue().strip().splitlines()
    assert len(lines) == 1
    return json.loads(lines[0])


def test_bootstrap_prints_one_json_line_of_working_credentials(db, capsys, client_for):
    result = _bootstrap(capsys)

    assert set(result) == {"user_token", "trainer_token", "project_id", "username", "password"}
    demo = authenticate(username="demo", password="demo")
    assert demo is not None and not demo.is_staff
    assert api_token_authenticate(raw=result["user_token"]).user == demo
    trainer = api_token_authenticate(raw=result["trainer_token"]).user
    assert trainer.username == "tandem-trainer" and user_is_trainer(user=trainer)
    assert not trainer.is_staff  # a trainer, not an administrator
    assert not trainer.has_usable_password()
    membership = Membership.objects.get(user=demo, project_id=result["project_id"])
    assert membership.role == "owner" and membership.project.name == "demo"
    calculator = Environment.objects.get(project_id=result["project_id"], name="calculator")
    version = calculator.versions.get()
    assert version.entrypoint == "environments.builtin.calculator:CalculatorEnvironment"
    assert version.kind == "python" and version.settings == {}
    assert [tool["name"] for tool in version.tools] == ["calc"]
    assert version.status == "pending" and version.probes.get().purpose == "registration"

    demo.raw_token = result["user_token"]
    runs = client_for(demo).post("/api/runs/", {"environment": "calculator"}, format="json")
    assert runs.status_code == 201


def test_bootstrap_is_idempotent_and_replaces_its_tokens(db, capsys):
    first = _bootstrap(capsys)
    second = _bootstrap(capsys)

    tokens = ("user_token", "trainer_token")
    assert first["password"] == "demo" and second["password"] is None  # shown once
    unchanged = [key for key in first if key not in (*tokens, "password")]
    assert {k: first[k] for k in unchanged} == {k: second[k] for k in unchanged}
    for key in tokens:
        assert api_token_authenticate(raw=first[key]) is None
        assert api_token_authenticate(raw=second[key]) is not None
    assert get_user_model().objects.count() == 2
    assert Environment.objects.count() == len(BUILTIN_ENVIRONMENTS)  # calculator (three presets), shop
    assert EnvironmentVersion.objects.count() == len(BUILTIN_ENVIRONMENTS)
    assert authenticate(username="demo", password="demo") is not None


def test_a_deployments_first_user_gets_a_generated_password_not_a_known_one(db, capsys, monkeypatch):
    monkeypatch.delenv("TANDEM_BOOTSTRAP_PASSWORD", raising=False)
    result = _bootstrap(capsys, "--username", "admin")

    password = result["password"]
    assert len(password) >= 20 and password not in ("demo", "admin", "password")
    assert authenticate(username="admin", password=password) is not None
    assert authenticate(username="admin", password="demo") is None
    # Printed once: a second run does not know it, and does not change it.
    assert _bootstrap(capsys, "--username", "admin")["password"] is None
    assert authenticate(username="admin", password=password) is not None


def test_the_first_users_password_can_come_from_the_environment(db, capsys, monkeypatch):
    monkeypatch.setenv("TANDEM_BOOTSTRAP_PASSWORD", "from-the-operators-secret-store")
    result = _bootstrap(capsys, "--username", "admin")

    assert result["password"] == "from-the-operators-secret-store"
    assert authenticate(username="admin", password="from-the-operators-secret-store") is not None


def test_rerunning_the_bootstrap_never_resets_a_password_or_reactivates_a_user(db, capsys):
    _bootstrap(capsys)
    demo = get_user_model().objects.get(username="demo")
    demo.set_password("changed-by-its-owner")
    demo.save()

    again = _bootstrap(capsys)  # --password demo again
    assert again["password"] is None
    assert authenticate(username="demo", password="demo") is None
    assert authenticate(username="demo", password="changed-by-its-owner") is not None

    demo.refresh_from_db()
    demo.is_active = False
    demo.save()
    with pytest.raises(CommandError, match="deactivated"):
        _bootstrap(capsys)
    demo.refresh_from_db()
    assert not demo.is_active
