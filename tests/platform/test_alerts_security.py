"""Webhook URLs and what is posted to them, under hostile input (issue 28, findings 11, 13, 14, 15):
URLs that cannot be posted to are refused naming the field and without telling what a name resolves to;
a listed name that resolves to a private address is still refused where those are; Slack's markup
in run names and environment errors is escaped; viewers never read a webhook URL whole."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from alerts.models import AlertRule, WebhookDelivery
from environment_registry.services import environment_probe_record
from runs.services import run_claim_next, run_heartbeat, run_transition
from tandem.contracts import ProbeCheck, ProbeReport, RunStatus, TrainerHeartbeat
from tests.platform.conftest import TRAINER_NAME

from .test_alerts_webhooks import SECRET, _hooked_rule, eager_tasks, receiver  # noqa: F401 - the fixtures

HOSTILE = "<!channel> & <http://evil.example|click here> <@U0123>"


@pytest.fixture(autouse=True)
def webhooks_to_localhost(settings):
    settings.TANDEM_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]


def _create(api, project, url: str, **overrides):
    body = {"project": project.pk, "name": "failures", "kind": "run_failed", "webhook_url": url,
            "webhook_secret": SECRET, **overrides}
    return api.post("/api/alert-rules/", body, format="json")


# ---- finding 11: URLs that can never be posted to ------------------------------------------------

@pytest.mark.parametrize("url", [
    "http://127.0.0.1:99999/hook",
    "http://127.0.0.1:0/hook",
    "http://127.0.0.1:8080/hook\r\nX-Injected: 1",
    "http://127.0.0.1:8080/ho\nok",
    "http://127.0.0.1:8080/ho\tok",
    "http://127.0.0.1:8080/ho\x7fok",
    "http://127.0.0.1:8080/ho ok",
])
def test_a_webhook_url_with_a_bad_port_or_control_characters_is_a_400_naming_the_field(api, project, url):
    response = _create(api, project, url)

    assert response.status_code == 400, response.content[:300]
    assert list(response.json()["error"]["fields"]) == ["webhook_url"]
    assert not AlertRule.objects.exclude(kind=AlertRule.Kind.TOOLS_UNUSED).exists()  # none but the default


def test_a_refusal_does_not_tell_what_a_host_name_resolves_to(api, project, settings):
    settings.TANDEM_WEBHOOK_ALLOWED_HOSTS = ["10.0.0.0/8"]
    response = _create(api, project, "http://localhost:8080/hook")

    assert response.status_code == 400
    [message] = response.json()["error"]["fields"]["webhook_url"]
    assert "127.0.0.1" not in message and "::1" not in message, message
    assert "TANDEM_WEBHOOK_ALLOWED_HOSTS" in message


def test_a_delivery_whose_url_cannot_be_posted_to_fails_with_its_reason_instead_of_staying_pending(
    eager_tasks, project, running_run, settings, django_capture_on_commit_callbacks,  # noqa: F811
):
    settings.TANDEM_WEBHOOK_MAX_ATTEMPTS = 1
    rule = _hooked_rule(project, "http://127.0.0.1:8080/hook")
    # As stored before URLs were checked for their port.
    AlertRule.objects.filter(pk=rule.pk).update(webhook_url="http://127.0.0.1:99999/hook")
    with django_capture_on_commit_callbacks(execute=True):
        run_transition(run=running_run, to_status=RunStatus.FAILED, reason="boom")

    delivery = WebhookDelivery.objects.get()
    assert delivery.status == "failed"
    [attempt] = delivery.attempt_log.all()
    assert attempt.error


# ---- finding 13: a listed name that resolves to a private address ------------------------------

def test_a_listed_name_resolving_to_loopback_is_refused_where_private_addresses_are(api, project, settings):
    settings.TANDEM_WEBHOOK_ALLOWED_HOSTS = ["localhost"]
    settings.TANDEM_ENVIRONMENT_URL_REFUSE_PRIVATE = True

    refused = _create(api, project, "http://localhost:8080/hook")
    assert refused.status_code == 400, refused.json()
    [message] = refused.json()["error"]["fields"]["webhook_url"]
    assert "private or loopback" in message and "127.0.0.1" not in message

    # The operator allows it by listing the network, or by allowing private addresses.
    settings.TANDEM_WEBHOOK_ALLOWED_HOSTS = ["localhost", "127.0.0.0/8", "::1"]
    assert _create(api, project, "http://localhost:8080/hook").status_code == 201
    settings.TANDEM_WEBHOOK_ALLOWED_HOSTS = ["localhost"]
    settings.TANDEM_ENVIRONMENT_URL_REFUSE_PRIVATE = False
    assert _create(api, project, "http://localhost:8080/hook", name="second").status_code == 201


def test_a_listed_name_resolving_to_loopback_is_refused_when_connecting_too(
    eager_tasks, receiver, project, running_run, settings, django_capture_on_commit_callbacks,  # noqa: F811
):
    settings.TANDEM_WEBHOOK_MAX_ATTEMPTS = 1
    settings.TANDEM_WEBHOOK_ALLOWED_HOSTS = ["localhost"]
    port = receiver.url.split(":")[2].split("/")[0]
    _hooked_rule(project, f"http://localhost:{port}/hooks/tandem")  # allowed when saved
    settings.TANDEM_ENVIRONMENT_URL_REFUSE_PRIVATE = True  # then the operator refuses private addresses
    with django_capture_on_commit_callbacks(execute=True):
        run_transition(run=running_run, to_status=RunStatus.FAILED, reason="boom")

    assert receiver.posts == []
    [attempt] = WebhookDelivery.objects.get().attempt_log.all()
    assert "private or loopback" in attempt.error


# ---- finding 14: Slack's markup in what users and environments write -----------------------------

def _posted(hook_receiver) -> dict:
    [(_, body)] = hook_receiver.posts
    return json.loads(body)


def _assert_escaped(text: str) -> None:
    assert "<" not in text and ">" not in text, text
    assert "&lt;!channel&gt;" in text and "&amp;" in text and "&lt;http://evil.example|click here&gt;" in text


def test_run_names_and_failure_reasons_are_escaped_in_slack_text(
    eager_tasks, receiver, project, environment, make_run, django_capture_on_commit_callbacks,  # noqa: F811
):
    _hooked_rule(project, receiver.url)
    run = make_run(project, environment=environment, name=f"run {HOSTILE}")
    run = run_heartbeat(run=run_claim_next(worker=TRAINER_NAME), heartbeat=TrainerHeartbeat(worker=TRAINER_NAME))
    with django_capture_on_commit_callbacks(execute=True):
        run_transition(run=run, to_status=RunStatus.FAILED, reason=f"EnvironmentError: {HOSTILE}")

    payload = _posted(receiver)
    assert payload["text"].count("&lt;!channel&gt;") == 2
    _assert_escaped(payload["text"])
    for attachment_field in payload["attachments"][0]["fields"]:
        assert "<" not in attachment_field["value"] and ">" not in attachment_field["value"]
    # The machine-readable copy keeps the exact text.
    assert payload["alert"]["details"]["reason"] == f"EnvironmentError: {HOSTILE}"


def test_environment_probe_errors_are_escaped_in_slack_text(
    eager_tasks, receiver, project, make_environment, django_capture_on_commit_callbacks,  # noqa: F811
):
    _hooked_rule(project, receiver.url)
    AlertRule.objects.update(kind=AlertRule.Kind.PROBE_FAILED)
    environment = make_environment(project, probed=False)
    probe = environment.versions.get().probes.get()
    checks = (ProbeCheck(name="load", status="failed", message=HOSTILE, latency_s=0.01, timeout_s=5.0),)
    with django_capture_on_commit_callbacks(execute=True):
        environment_probe_record(report=ProbeReport(probe_id=probe.pk, checks=checks, worker="test:1",
                                                    started_at=0.0, finished_at=0.05))

    payload = _posted(receiver)
    _assert_escaped(payload["text"])


# ---- finding 15: viewers and webhook URLs ------------------------------------------------------

def test_a_viewer_sees_a_webhook_url_redacted_in_the_api_and_the_page(
    api, project, make_user, client_for, eager_tasks, running_run, settings,  # noqa: F811
    django_capture_on_commit_callbacks,
):
    settings.TANDEM_WEBHOOK_MAX_ATTEMPTS = 1
    url = "http://127.0.0.1:9/services/T000/B000/XXXXSECRETPATH"
    rule = _create(api, project, url).json()
    assert rule["webhook_url"] == url  # its writers see it whole
    with django_capture_on_commit_callbacks(execute=True):
        run_transition(run=running_run, to_status=RunStatus.FAILED, reason="boom")
    viewer = make_user()
    project.memberships.create(user=viewer, role="viewer")
    as_viewer = client_for(viewer)

    responses = [as_viewer.get("/api/alert-rules/"), as_viewer.get(f"/api/alert-rules/{rule['id']}/"),
                 as_viewer.get(f"/api/alert-rules/{rule['id']}/deliveries/")]
    page = Client()
    page.force_login(viewer)
    responses.append(page.get("/alerts/"))
    for response in responses:
        assert response.status_code == 200
        assert "XXXXSECRETPATH" not in response.content.decode() and "/services/" not in response.content.decode()
    assert responses[1].json()["webhook_url"] == "http://127.0.0.1:9/…"
    assert responses[2].json()["results"][0]["url"] == "http://127.0.0.1:9/…"
    assert "http://127.0.0.1:9/…" in responses[3].content.decode()
    # A member still reads it whole.
    assert api.get(f"/api/alert-rules/{rule['id']}/deliveries/").json()["results"][0]["url"] == url
    # The edit form holds the URL whole: a viewer never opens it.
    refused = page.get(f"/alerts/{rule['id']}/edit/")
    assert refused.status_code == 403 and "XXXXSECRETPATH" not in refused.content.decode()
    owner = Client()
    owner.force_login(project.owner)
    assert url in owner.get(f"/alerts/{rule['id']}/edit/").content.decode()
