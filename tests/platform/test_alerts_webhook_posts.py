"""A webhook receiver cannot hold the platform: each post has a total deadline, reads at most
1 KiB of the answer, holds no database lock, and runs on a prefork worker of its own whose task
time limit is enforced (issue 28, finding 1).

The receivers are real HTTP servers on 127.0.0.1 (threads of this process); the first tests run
the Celery task eagerly, the last one in a real ``celery worker --pool prefork`` process.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.db import DatabaseError, connection, transaction

from alerts import services as alert_services
from alerts import webhooks
from alerts.models import WebhookAttempt, WebhookDelivery
from tandem.contracts import WEBHOOKS_QUEUE
from tests.platform.queue_workers import platform_queue_worker
from tests.polling import poll_until

from .test_alerts_webhooks import _fail, _hooked_rule, eager_tasks  # noqa: F401 - the fixture

# What the trickling receiver answers, one byte at a time; it takes about TRICKLE_PAUSE_S per byte.
TRICKLED_ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
# A receiver that never ends trickles a header that never ends.
ENDLESS_ANSWER_START = b"HTTP/1.1 200 OK\r\nX-Trickle: "
TRICKLE_PAUSE_S = 0.25
# Far more than the kernel's socket buffers hold, so a client that stops reading stops the sender.
HUGE_ANSWER_BYTES = 256 * 1024 * 1024


@dataclass
class SlowReceiver:
    """Trickles its answer; while it does, it checks from a connection of its own that the delivery's
    row is not locked and that a second worker cannot claim the delivery."""

    url: str = ""
    forever: bool = False
    sent: int = 0
    closed_by_client: bool = False
    row_lock_free: bool | None = None
    second_claim: object = "not tried"
    requests: int = 0
    stop: threading.Event = field(default_factory=threading.Event)


def _serve(handler_class) -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler_class)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/hooks/tandem"


@pytest.fixture
def slow_receiver() -> Iterator[SlowReceiver]:
    state = SlowReceiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            state.requests += 1
            delivery_id = int(self.headers["X-Tandem-Delivery"])
            try:
                self._check_the_row(delivery_id)
            finally:
                connection.close()  # this thread's own connection
            answer = ENDLESS_ANSWER_START if state.forever else TRICKLED_ANSWER
            while (state.forever or state.sent < len(answer)) and not state.stop.is_set():
                byte = answer[state.sent:state.sent + 1] or b"a"
                try:
                    self.wfile.write(byte)
                    self.wfile.flush()
                except OSError:
                    state.closed_by_client = True
                    return
                state.sent += 1
                time.sleep(TRICKLE_PAUSE_S)

        def _check_the_row(self, delivery_id: int) -> None:
            # NOWAIT: a row another transaction holds is an error at once, not a wait.
            try:
                with transaction.atomic():
                    list(WebhookDelivery.objects.select_for_update(nowait=True).filter(pk=delivery_id))
                state.row_lock_free = True
            except DatabaseError:
                state.row_lock_free = False
                return
            state.second_claim = alert_services.webhook_delivery_claim(delivery_id=delivery_id)

        def log_message(self, *args):
            pass

    server, state.url = _serve(Handler)
    try:
        yield state
    finally:
        state.stop.set()
        server.shutdown()
        server.server_close()


@dataclass
class HugeReceiver:
    url: str = ""
    sent: int = 0
    closed_by_client: bool = False


@pytest.fixture
def huge_receiver() -> Iterator[HugeReceiver]:
    state = HugeReceiver()
    chunk = b"A" * 65536

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", str(HUGE_ANSWER_BYTES))
            self.end_headers()
            try:
                while state.sent < HUGE_ANSWER_BYTES:
                    self.wfile.write(chunk)
                    state.sent += len(chunk)
            except OSError:
                state.closed_by_client = True

        def log_message(self, *args):
            pass

    server, state.url = _serve(Handler)
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def test_a_trickling_receiver_is_cut_off_at_the_posts_deadline_and_no_row_stays_locked_meanwhile(
    eager_tasks, slow_receiver, project, running_run, settings, transactional_db,  # noqa: F811
    django_capture_on_commit_callbacks,
):
    settings.TANDEM_WEBHOOK_MAX_ATTEMPTS = 1
    # The whole answer takes about 15 s to trickle; the post's deadline is a fraction of it.
    settings.TANDEM_WEBHOOK_TIMEOUT_S = 2.0
    _hooked_rule(project, slow_receiver.url)
    _fail(running_run, django_capture_on_commit_callbacks)

    delivery = WebhookDelivery.objects.get()
    assert slow_receiver.row_lock_free is True, "the delivery's row was locked while it was posted"
    assert slow_receiver.second_claim is None, "a second worker claimed a delivery that was being posted"
    # The receiver sees the connection closed at its next byte or the one after (the first may meet the RST).
    poll_until(lambda: slow_receiver.closed_by_client, timeout_s=30, what="the post to close the connection")
    assert slow_receiver.sent < len(TRICKLED_ANSWER)
    [attempt] = delivery.attempt_log.all()
    assert (delivery.status, attempt.outcome, attempt.response_code) == ("failed", "failed", None)
    assert "deadline" in attempt.error and "2 s" in attempt.error
    assert delivery.lease_expires_at is None


def test_a_huge_answer_is_read_no_further_than_its_first_kibibyte(
    eager_tasks, huge_receiver, project, running_run, settings, django_capture_on_commit_callbacks,  # noqa: F811
):
    _hooked_rule(project, huge_receiver.url)
    _fail(running_run, django_capture_on_commit_callbacks)

    # The receiver's thread learns of the close at its next write, which may come after the post returned.
    poll_until(lambda: huge_receiver.closed_by_client, timeout_s=30,
               what=lambda: f"the receiver to see the connection closed ({huge_receiver.sent} bytes sent)")
    assert huge_receiver.sent < HUGE_ANSWER_BYTES, (
        f"the receiver sent {huge_receiver.sent} of {HUGE_ANSWER_BYTES} bytes: the answer was read whole")
    delivery = WebhookDelivery.objects.get()
    [attempt] = delivery.attempt_log.all()
    assert (delivery.status, attempt.response_code) == ("delivered", 200)
    assert webhooks.RESPONSE_EXCERPT_BYTES <= 1024
    assert attempt.response_excerpt == "A" * webhooks.RESPONSE_EXCERPT_BYTES


def test_a_delivery_another_worker_holds_is_not_claimed_until_its_lease_lapses(project, running_run, settings):
    settings.TANDEM_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    rule = _hooked_rule(project, "http://127.0.0.1:9/hook")
    firing = rule.firings.create(project=project, rule_name=rule.name, kind=rule.kind, subject="run:1",
                                 text="t", fired_at=running_run.created_at)
    delivery = WebhookDelivery.objects.create(firing=firing, rule=rule, url=rule.webhook_url, body="{}",
                                              created_at=running_run.created_at)

    first = alert_services.webhook_delivery_claim(delivery_id=delivery.pk)
    assert first is not None and first.number == 1
    assert alert_services.webhook_delivery_claim(delivery_id=delivery.pk) is None
    WebhookDelivery.objects.filter(pk=delivery.pk).update(lease_expires_at=running_run.created_at)
    second = alert_services.webhook_delivery_claim(delivery_id=delivery.pk)
    # The lapsed attempt is recorded as such, and the next one has the next number.
    assert second is not None and second.number == 2
    [abandoned] = WebhookAttempt.objects.filter(delivery=delivery)
    assert abandoned.number == 1 and abandoned.outcome == "failed" and "lease" in abandoned.error


def test_a_delivery_whose_worker_died_mid_post_is_sent_again_by_the_sweep(
    eager_tasks, project, running_run, settings, django_capture_on_commit_callbacks,  # noqa: F811
):
    settings.TANDEM_WEBHOOK_MAX_ATTEMPTS = 1
    rule = _hooked_rule(project, "http://127.0.0.1:9/hook")
    firing = rule.firings.create(project=project, rule_name=rule.name, kind=rule.kind, subject="run:1",
                                 text="t", fired_at=running_run.created_at)
    # As a worker killed at its hard time limit leaves it: claimed, its lease lapsed, no attempt recorded.
    delivery = WebhookDelivery.objects.create(firing=firing, rule=rule, url=rule.webhook_url, body="{}",
                                              created_at=running_run.created_at, status="sending", attempts=1,
                                              lease_expires_at=running_run.created_at)

    assert alert_services.webhook_deliveries_resume() == 1

    delivery.refresh_from_db()
    [lapsed] = delivery.attempt_log.all()
    assert (delivery.status, lapsed.number, lapsed.outcome) == ("failed", 1, "failed")
    assert "lease lapsed" in lapsed.error and "worker stopped" in delivery.status_reason
    assert alert_services.webhook_deliveries_resume() == 0


@pytest.fixture
def webhooks_worker(transactional_db, tmp_path):
    """A real Celery prefork worker on the webhooks queue, as the stack runs it, with a short task time
    limit and a post deadline far past it: only the time limit can end a stuck post."""
    log = tmp_path / "celery.log"
    with platform_queue_worker(WEBHOOKS_QUEUE, log=log, env={
        "TANDEM_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
        "TANDEM_WEBHOOK_TIMEOUT_S": "600",
        "TANDEM_WEBHOOK_TASK_SOFT_TIME_LIMIT_S": "3",
        "TANDEM_WEBHOOK_TASK_TIME_LIMIT_S": "6",
        "TANDEM_WEBHOOK_MAX_ATTEMPTS": "1",
    }) as process:
        yield process, log


def test_the_webhooks_prefork_worker_ends_a_stuck_post_at_the_tasks_time_limit(
    webhooks_worker, slow_receiver, project, running_run, settings, django_capture_on_commit_callbacks,
):
    settings.TANDEM_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    process, log = webhooks_worker
    slow_receiver.forever = True  # only the worker's time limit ends this post
    _hooked_rule(project, slow_receiver.url)
    _fail(running_run, django_capture_on_commit_callbacks)

    delivery = poll_until(
        lambda: WebhookDelivery.objects.filter(status=WebhookDelivery.Status.FAILED).first(), timeout_s=90,
        what=lambda: f"the delivery to fail ({list(WebhookDelivery.objects.values('status', 'attempts'))})"
                     f"\n{log.read_text()[-3000:]}")
    [attempt] = delivery.attempt_log.all()
    assert "time limit" in attempt.error, attempt.error
    assert slow_receiver.requests == 1
    poll_until(lambda: slow_receiver.closed_by_client, timeout_s=30, what="the worker to close the connection")
    assert process.poll() is None  # the worker itself lives on


def test_deliveries_are_sent_to_the_webhooks_queue(project, running_run, django_capture_on_commit_callbacks,
                                                   settings):
    settings.TANDEM_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]
    from alerts.tasks import deliver_webhook

    # Routed by the task table (tandem.contracts.tasks), as the platform app's task_routes.
    assert deliver_webhook.app.amqp.router.route({}, deliver_webhook.name)["queue"].name == WEBHOOKS_QUEUE
    assert deliver_webhook.time_limit and deliver_webhook.soft_time_limit
    assert deliver_webhook.soft_time_limit < deliver_webhook.time_limit
