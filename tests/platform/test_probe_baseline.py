"""The imported model's baseline in a probe, as the platform asks for it, checks it, keeps it and shows it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from environment_registry.models import EnvironmentProbe
from environment_registry.services import (
    environment_probe_record,
    environment_probe_request,
    environment_probes_expire,
)
from tandem.allowlists.model_paths import DEFAULT_MODEL_ROOT
from tandem.contracts import (
    PROBE_QUEUE,
    ProbeBaseline,
    ProbeBaselineRequest,
    ProbeCheck,
    ProbeReport,
    ProbeRequest,
    ProbeTimeouts,
    probe_request_key,
)

MODEL = str(DEFAULT_MODEL_ROOT / "smollm2-135m-instruct")
CALCULATOR = {
    "name": "products", "kind": "python", "entrypoint": "environments.builtin.calculator:CalculatorEnvironment",
    "settings": {"prompt_style": "chat", "min_operand": 100, "max_operand": 999, "operators": "*"},
    "tools": [{"name": "calc", "description": "Evaluates an arithmetic expression.",
               "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                              "required": ["expression"]}}],
}


@pytest.fixture
def sent(redis_client, django_capture_on_commit_callbacks):
    """Registers through the API with the on-commit sends run; returns the probe request in Redis."""
    redis_client.delete(PROBE_QUEUE)
    keys = []

    def register(api, **body) -> tuple[EnvironmentProbe, ProbeRequest]:
        with django_capture_on_commit_callbacks(execute=True):
            response = api.post("/api/environments/", {**CALCULATOR, **body}, format="json")
        assert response.status_code == 201, response.json()
        probe = EnvironmentProbe.objects.get(version_id=response.json()["versions"][0]["id"])
        keys.append(probe_request_key(probe.pk))
        return probe, ProbeRequest.model_validate_json(redis_client.get(keys[-1]))

    yield register
    redis_client.delete(PROBE_QUEUE, *keys)


def test_a_registration_that_asks_for_a_baseline_sends_it_with_the_probe(api, project, sent):
    probe, request = sent(api, project=project.pk, baseline={"model": MODEL, "episodes": 16})

    assert request.baseline == ProbeBaselineRequest(model=MODEL, episodes=16)
    assert probe.baseline_request == request.baseline.model_dump(mode="json")
    assert probe.baseline is None  # nothing shown until a worker reports


def test_without_one_the_operators_default_is_sent_and_health_checks_never_play_one(
        api, project, sent, settings, django_capture_on_commit_callbacks):
    settings.TANDEM_PROBE_BASELINE_MODEL = MODEL
    probe, request = sent(api, project=project.pk)
    assert request.baseline == ProbeBaselineRequest(model=MODEL)

    asked = ProbeBaselineRequest(model=MODEL, episodes=2)
    health = environment_probe_request(version=probe.version, purpose="health", baseline=asked)
    manual = environment_probe_request(version=probe.version, purpose="manual")
    assert health.baseline_request is None and manual.baseline_request is None

    settings.TANDEM_PROBE_BASELINE_MODEL = ""
    _, unasked = sent(api, project=project.pk, name="products-2")
    assert unasked.baseline is None


def test_probing_again_may_ask_for_a_baseline(api, environment):
    response = api.post(f"/api/environments/{environment.pk}/versions/1/probe/",
                        {"baseline": {"model": MODEL, "episodes": 4}}, format="json")

    assert response.status_code == 202, response.json()
    assert response.json()["baseline_request"]["model"] == MODEL
    assert response.json()["baseline_request"]["episodes"] == 4


@pytest.mark.parametrize(("baseline", "field"), [
    ({"model": "/etc"}, "baseline.model"),
    ({"model": f"{MODEL}/../../../etc"}, "baseline.model"),
    ({"model": MODEL, "episodes": 0}, "baseline.episodes"),
    ({"model": MODEL, "episodes": 65}, "baseline.episodes"),
    ({"model": MODEL, "temperature": -1}, "baseline.temperature"),
    ({"model": MODEL, "seed": 3}, "baseline.seed"),
    ({"episodes": 4}, "baseline.model"),
    ("var/models/x", "baseline"),
])
def test_a_bad_baseline_is_400_naming_its_field_and_registers_nothing(api, project, baseline, field):
    response = api.post("/api/environments/", {**CALCULATOR, "project": project.pk, "baseline": baseline},
                        format="json")

    assert response.status_code == 400
    assert field in response.json()["error"]["fields"], response.json()
    assert not EnvironmentProbe.objects.exists()


def _report(probe: EnvironmentProbe, *, tool_call_rate: float) -> ProbeReport:
    checks = (ProbeCheck(name="close", status="passed", message="closed", latency_s=0.01, timeout_s=10),
              ProbeCheck(name="baseline", status="warning" if tool_call_rate == 0 else "passed",
                         message="the model never called a tool", latency_s=31.0, timeout_s=900))
    baseline = ProbeBaseline(model=MODEL, episodes=8, statuses={"ok": 8}, mean_reward=0.0,
                             tool_use={"tool_call_rate": tool_call_rate, "tool_calls_per_episode": 0.0,
                                       "answered_no_tools_rate": 1.0},
                             tool_use_ci95={"tool_call_rate": (0.0, 0.3244), "answered_no_tools_rate": (0.6756, 1.0)},
                             wall_s=31.0)
    return ProbeReport(probe_id=probe.pk, checks=checks, worker="test:1", started_at=0.0, finished_at=31.0,
                       baseline=baseline)


def test_the_reported_baseline_is_kept_shown_by_the_api_and_on_the_environment_page(api, project, user, sent):
    probe, _ = sent(api, project=project.pk, baseline={"model": MODEL})
    environment_probe_record(report=_report(probe, tool_call_rate=0.0))

    probe.refresh_from_db()
    assert probe.status == "passed" and probe.version.status == "ready"  # a warning is not a failure
    shown = api.get(f"/api/environments/{probe.version.environment_id}/versions/1/").json()["probes"][0]
    assert shown["baseline"]["tool_use"]["tool_call_rate"] == 0.0
    assert shown["baseline"]["tool_use_ci95"]["tool_call_rate"] == [0.0, 0.3244]

    browser = Client()
    browser.force_login(user)
    page = browser.get(f"/environments/{probe.version.environment_id}/").content.decode()
    assert "Baseline of <code>" in page and MODEL in page
    assert "8 held-out episodes (8 ok), mean reward 0.000" in page
    assert "<td>Tool-call rate</td><td>0.000</td><td>0.000 to 0.324</td>" in page
    assert "<td>Answered without a call</td><td>1.000</td>" in page
    assert "the model never called a tool" in page


def test_a_probe_that_plays_a_baseline_is_given_its_time_before_it_expires(api, project, sent, settings):
    plain, _ = sent(api, project=project.pk)
    with_baseline, _ = sent(api, project=project.pk, name="products-2", baseline={"model": MODEL})
    baseline_s = ProbeTimeouts().baseline
    past_expiry = timezone.now() + timedelta(seconds=settings.TANDEM_PROBE_EXPIRY_S + 1)

    assert environment_probes_expire(now=past_expiry) == 1
    plain.refresh_from_db(), with_baseline.refresh_from_db()
    assert plain.status == "failed" and with_baseline.status == "pending"

    assert environment_probes_expire(now=past_expiry + timedelta(seconds=baseline_s)) == 1
    with_baseline.refresh_from_db()
    assert with_baseline.status == "failed"


def test_the_registration_form_asks_for_a_baseline_model_and_shows_a_refused_one_at_its_field(user, project):
    browser = Client()
    browser.force_login(user)
    form = {"project": project.pk, "name": "products", "kind": "python",
            "entrypoint": CALCULATOR["entrypoint"], "settings": '{"operators": "*"}', "tools": ""}

    refused = browser.post("/environments/", {**form, "baseline_model": "/etc"})
    assert refused.status_code == 200
    page = refused.content.decode()
    # Under the field it names: its input, its help, then the error.
    after_input = page[page.index('id="id_baseline_model"'):]
    assert after_input.index('<p class="error">') < after_input.index("</form>")
    assert "TANDEM_MODEL_ROOTS" in after_input[:after_input.index("</form>")]
    assert not EnvironmentProbe.objects.exists()

    accepted = browser.post("/environments/", {**form, "baseline_model": MODEL})
    assert accepted.status_code == 302
    assert EnvironmentProbe.objects.get().baseline_request["model"] == MODEL
