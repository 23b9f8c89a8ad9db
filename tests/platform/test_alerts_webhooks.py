"""Alert webhooks posted to a real HTTP receiver on 127.0.0.1, signed, retried, every attempt recorded.

The Celery task runs eagerly (in this process, retries included) once the firing commits.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from alerts.models import AlertRule, WebhookDelivery
from alerts.services import alert_rule_create
from config.celery import app as celery_app
from runs.services import run_transition
from tandem.contracts import RunStatus

SECRET = "whsec-0123456789abcdef"


@dataclass
class Receiver:
    """A webhook receiver: answers each post with the next of ``statuses`` (the last one repeats)."""

    url: str
    statuses: list[int]
    posts: list[tuple[dict[str, str], bytes]] = field(default_factory=list)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    state = Receiver(url="", statuses=[200])

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            state.posts.append(({key.lower(): value for key, value in self.headers.items()}, body))
            status = state.statuses[min(len(state.posts), len(state.statuses)) - 1]
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/tandem"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def eager_tasks(settings):
    """Webhooks to 127.0.0.1 allowed, and Celery tasks run where they are sent, retries included."""
    settings.TANDEM_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = False


def _closed_port_url() -> str:
    """A URL on 127.0.0.1 whose port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}/hook"


def _fail(run, capture, reason: str = "CheckpointError: disk full") -> None:
    with capture(execute=True):
        run_transition(run=run, to_status=RunStatus.FAILED, reason=reason)


def _hooked_rule(project, url: str) -> AlertRule:
    return alert_rule_create(user=project.owner, project=project, name="failures", kind=AlertRule.Kind.RUN_FAILED,
                             webhook_url=url, webhook_secret=SECRET)


def test_a_firing_is_posted_as_slack_compatible_json_signed_with_the_rules_secret(
    eager_tasks, receiver, project, running_run, django_capture_on_commit_callbacks, settings
):
    settings.TANDEM_PUBLIC_URL = "https://tandem.example.com"
    _hooked_rule(project, receiver.url)
    _fail(running_run, django_capture_on_commit_callbacks)

    [(headers, body)] = receiver.posts
    expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(headers["x-tandem-signature"], expected)
    assert headers["content-type"] == "application/json"
    payload = json.loads(body)
    assert payload["text"].startswith("[Tandem] Run") and "CheckpointError: disk full" in payload["text"]
    assert payload["alert"]["kind"] == "run_failed" and payload["alert"]["run"] == running_run.pk
    assert payload["alert"]["project"] == {"id": project.pk, "name": project.name}
    # A link to the run, at the dashboard's address as people reach it (TANDEM_PUBLIC_URL, the settings').
    run_url = f"https://tandem.example.com/runs/{running_run.pk}/"
    assert payload["alert"]["run_url"] == run_url
    assert {"title": "run", "value": run_url, "short": False} in payload["attachments"][0]["fields"]
    assert {"title": "status", "value": "failed", "short": True} in payload["attachments"][0]["fields"]
    assert SECRET.encode() not in body
    delivery = WebhookDelivery.objects.get()
    assert headers["x-tandem-delivery"] == str(delivery.pk)
    assert (delivery.status, delivery.attempts) == ("delivered", 1)


def test_a_receiver_that_fails_twice_gets_three_attempts_each_recorded(
    eager_tasks, receiver, project, running_run, django_capture_on_commit_callbacks, api
):
    receiver.statuses = [500, 500, 200]
    rule = _hooked_rule(project, receiver.url)
    _fail(running_run, django_capture_on_commit_callbacks)

    assert len(receiver.posts) == 3
    assert len({body for _, body in receiver.posts}) == 1  # the same body, signed the same, each time
    delivery = WebhookDelivery.objects.get()
    assert (delivery.status, delivery.attempts) == ("delivered", 3)
    attempts = list(delivery.attempt_log.values_list("number", "outcome", "response_code"))
    assert attempts == [(1, "failed", 500), (2, "failed", 500), (3, "delivered", 200)]

    [listed] = api.get(f"/api/alert-rules/{rule.pk}/deliveries/").json()["results"]
    assert [attempt["response_code"] for attempt in listed["attempt_log"]] == [500, 500, 200]
    assert listed["attempt_log"][0]["error"] == "the receiver answered 500"


def test_a_delivery_that_never_succeeds_is_recorded_as_failed_after_its_attempts(
    eager_tasks, receiver, project, running_run, django_capture_on_commit_callbacks, settings
):
    settings.TANDEM_WEBHOOK_MAX_ATTEMPTS = 3
    receiver.statuses = [503]
    _hooked_rule(project, receiver.url)
    _fail(running_run, django_capture_on_commit_callbacks)

    delivery = WebhookDelivery.objects.get()
    assert (delivery.status, delivery.attempts, len(receiver.posts)) == ("failed", 3, 3)
    assert delivery.finished_at is not None


def test_an_unreachable_receiver_records_the_connection_error(
    eager_tasks, project, running_run, django_capture_on_commit_callbacks, settings
):
    settings.TANDEM_WEBHOOK_MAX_ATTEMPTS = 2
    _hooked_rule(project, _closed_port_url())
    _fail(running_run, django_capture_on_commit_callbacks)

    delivery = WebhookDelivery.objects.get()
    assert delivery.status == "failed"
    errors = list(delivery.attempt_log.values_list("response_code", "error"))
    assert len(errors) == 2 and all(code is None and error for code, error in errors)


def test_a_post_is_refused_at_connect_time_once_the_operator_drops_the_host(
    eager_tasks, receiver, project, running_run, django_capture_on_commit_callbacks, settings
):
    settings.TANDEM_WEBHOOK_MAX_ATTEMPTS = 1
    _hooked_rule(project, receiver.url)
    settings.TANDEM_WEBHOOK_ALLOWED_HOSTS = ["10.0.0.0/8"]
    _fail(running_run, django_capture_on_commit_callbacks)

    assert receiver.posts == []
    [attempt] = WebhookDelivery.objects.get().attempt_log.all()
    assert "TANDEM_WEBHOOK_ALLOWED_HOSTS" in attempt.error
