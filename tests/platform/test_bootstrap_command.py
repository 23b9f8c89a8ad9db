import io
import json

from django.contrib.auth import authenticate, get_user_model
from django.core.management import call_command

from accounts.models import Membership
from accounts.selectors import api_token_authenticate
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


def _bootstrap(capsys) -> dict:
    out = io.StringIO()
    call_command("tandem_bootstrap", *ARGS, stdout=out, stderr=io.StringIO())
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
    assert trainer.username == "tandem-trainer" and trainer.is_staff
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
    assert {k: v for k, v in first.items() if k not in tokens} == {
        k: v for k, v in second.items() if k not in tokens
    }
    for key in tokens:
        assert api_token_authenticate(raw=first[key]) is None
        assert api_token_authenticate(raw=second[key]) is not None
    assert get_user_model().objects.count() == 2
    assert Environment.objects.count() == len(BUILTIN_ENVIRONMENTS)  # calculator, calculator-chat
    assert EnvironmentVersion.objects.count() == len(BUILTIN_ENVIRONMENTS)
    assert authenticate(username="demo", password="demo") is not None
