import io
import json

from django.contrib.auth import authenticate, get_user_model
from django.core.management import call_command
from rest_framework.authtoken.models import Token

from accounts.models import Membership
from environments.models import Environment, EnvironmentVersion

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
    assert Token.objects.get(key=result["user_token"]).user == demo
    trainer = Token.objects.get(key=result["trainer_token"]).user
    assert trainer.username == "tandem-trainer" and trainer.is_staff
    assert not trainer.has_usable_password()
    membership = Membership.objects.get(user=demo, project_id=result["project_id"])
    assert membership.role == "owner" and membership.project.name == "demo"
    calculator = Environment.objects.get(project_id=result["project_id"], name="calculator")
    version = calculator.versions.get()
    assert version.entrypoint == "workers.environments.calculator:CalculatorEnvironment"
    assert version.kind == "python" and version.settings == {}
    assert [tool["name"] for tool in version.tools] == ["calc"]
    assert version.status == "pending" and version.probes.get().purpose == "registration"

    runs = client_for(demo).post("/api/runs/", {"environment": "calculator"}, format="json")
    assert runs.status_code == 201


def test_bootstrap_is_idempotent(db, capsys):
    first = _bootstrap(capsys)
    second = _bootstrap(capsys)

    assert first == second
    assert get_user_model().objects.count() == 2
    assert Environment.objects.count() == 1
    assert EnvironmentVersion.objects.count() == 1
    assert authenticate(username="demo", password="demo") is not None
