"""The run's WebSocket, through the real ASGI app and the real Redis channel layer."""

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from channels_redis.core import RedisChannelLayer
from django.db import transaction
from django.test import Client

from config.asgi import application
from evaluations.services import evaluation_record
from runs.realtime import run_broadcast
from tandem.contracts import EvaluationReport

from .builders import POINTS_PER_STEP_EVENT, step_event
from .test_evaluations_api import evaluation_report

pytestmark = pytest.mark.django_db(transaction=True)


def _headers(*, token=None, session=None, origin=None):
    headers = [(b"host", b"testserver")]
    if token is not None:
        headers.append((b"authorization", f"Token {token}".encode()))
    if session is not None:
        headers.append((b"cookie", f"sessionid={session}".encode()))
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    return headers


def _connects(run, headers) -> bool:
    return connects_to(f"/ws/runs/{run.pk}/", headers)


def connects_to(path: str, headers) -> bool:
    """Whether a WebSocket to ``path`` with ``headers`` is accepted."""
    async def scenario():
        communicator = WebsocketCommunicator(application, path, headers=headers)
        connected, _ = await communicator.connect(timeout=5)
        # A refused consumer lingers on its channel-layer receive; don't wait the default second.
        await communicator.disconnect(timeout=1 if connected else 0.1)
        return connected

    return async_to_sync(scenario)()


def _session_of(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def test_the_layer_is_the_real_redis_one():
    assert isinstance(get_channel_layer(), RedisChannelLayer)


def test_a_member_receives_the_metrics_the_trainer_posts(running_run, user, trainer_api):
    event = step_event(running_run.pk, 7)

    async def scenario():
        communicator = WebsocketCommunicator(
            application, f"/ws/runs/{running_run.pk}/", headers=_headers(token=user.raw_token)
        )
        connected, _ = await communicator.connect(timeout=5)
        assert connected
        response = await sync_to_async(trainer_api.post)(
            f"/api/trainer/runs/{running_run.pk}/telemetry/", {"events": [event]}, format="json"
        )
        assert response.status_code == 202
        message = await communicator.receive_json_from(timeout=5)
        await communicator.disconnect()
        return message

    message = async_to_sync(scenario)()

    assert message["type"] == "metrics"
    assert (message["run"], message["step"], message["status"]) == (running_run.pk, 7, "running")
    assert message["policy_version"] == 7 and message["phase"] == "rl"
    assert len(message["values"]) == POINTS_PER_STEP_EVENT
    assert message["values"]["trainer_idle_fraction"] == pytest.approx(0.25)


def test_a_member_receives_each_evaluation_the_trainer_posts_and_its_retry(running_run, user, trainer_api):
    url = f"/api/trainer/runs/{running_run.pk}/evaluations/"
    first = evaluation_report(0, step=10)
    retried = evaluation_report(0, step=10, status="incomplete", reason="run ended",
                                metrics={"success_rate": 0.5, "mean_reward": 0.25}, intervals={})

    async def scenario():
        communicator = WebsocketCommunicator(
            application, f"/ws/runs/{running_run.pk}/", headers=_headers(token=user.raw_token)
        )
        assert (await communicator.connect(timeout=5))[0]
        messages = []
        for report in (first, retried):
            response = await sync_to_async(trainer_api.post)(url, report, format="json")
            assert response.status_code in (200, 201), response.content
            messages.append(await communicator.receive_json_from(timeout=5))
        await communicator.disconnect()
        return messages

    new, updated = async_to_sync(scenario)()

    assert new == {
        "type": "evaluation", "run": running_run.pk, "index": 0, "step": 10, "policy_version": 5,
        "kind": "environment", "environment": "calculator@1", "series_label": "calculator@1", "status": "complete",
        "reason": "", "episodes": 32, "metrics": first["metrics"],
        "intervals": {"success_rate": [0.45, 0.77], "pass@4": [0.53, 0.98]},
    }  # no trajectory ids: up to 100,000 of them
    assert (updated["index"], updated["environment"], updated["status"]) == (0, "calculator@1", "incomplete")
    assert updated["metrics"] == {"success_rate": 0.5, "mean_reward": 0.25} and updated["intervals"] == {}


def test_an_evaluation_is_sent_only_once_its_transaction_commits(running_run, user):
    report = EvaluationReport.model_validate(evaluation_report(3, step=30))

    def record_then_mark():
        with transaction.atomic():
            evaluation_record(run=running_run, report=report)
            # Sent at once, while the evaluation's transaction is still open: it must arrive first.
            run_broadcast(running_run.pk, [{"type": "status", "run": running_run.pk, "status": "marker"}])

    async def scenario():
        communicator = WebsocketCommunicator(
            application, f"/ws/runs/{running_run.pk}/", headers=_headers(token=user.raw_token)
        )
        assert (await communicator.connect(timeout=5))[0]
        await sync_to_async(record_then_mark)()
        received = [await communicator.receive_json_from(timeout=5) for _ in range(2)]
        await communicator.disconnect()
        return received

    marker, evaluation = async_to_sync(scenario)()

    assert marker["status"] == "marker"
    assert (evaluation["type"], evaluation["index"], evaluation["step"]) == ("evaluation", 3, 30)


def test_a_member_sees_the_run_cancelled(running_run, user, api):
    async def scenario():
        communicator = WebsocketCommunicator(
            application, f"/ws/runs/{running_run.pk}/", headers=_headers(token=user.raw_token)
        )
        assert (await communicator.connect(timeout=5))[0]
        await sync_to_async(api.post)(f"/api/runs/{running_run.pk}/cancel/")
        message = await communicator.receive_json_from(timeout=5)
        await communicator.disconnect()
        return message

    message = async_to_sync(scenario)()

    assert message["type"] == "status" and message["status"] == "cancelled"
    assert message["status_reason"] == "Cancelled by alice."


def test_an_anonymous_connection_is_refused(running_run):
    assert not _connects(running_run, _headers())


def test_an_unknown_token_is_refused(running_run):
    assert not _connects(running_run, _headers(token="0" * 40))


def test_a_user_outside_the_project_is_refused(running_run, make_user):
    outsider = make_user()

    assert not _connects(running_run, _headers(token=outsider.raw_token))


def test_a_missing_run_is_refused(running_run, user):
    running_run.pk += 1000

    assert not _connects(running_run, _headers(token=user.raw_token))


def test_a_browser_session_from_the_page_itself_is_accepted(running_run, user):
    headers = _headers(session=_session_of(user), origin="http://testserver")

    assert _connects(running_run, headers)


def test_a_browser_session_from_another_site_is_refused(running_run, user):
    headers = _headers(session=_session_of(user), origin="https://evil.example")

    assert not _connects(running_run, headers)


def test_a_member_removed_from_the_project_has_their_socket_closed(running_run, user, api, make_user,
                                                                   client_for, project):
    # Finding 10 of the security audit: before, the socket of a removed member kept streaming.
    member = make_user("bea")
    assert api.post(f"/api/projects/{project.pk}/members/", {"username": "bea", "role": "viewer"},
                    format="json").status_code == 201

    async def scenario():
        communicator = WebsocketCommunicator(
            application, f"/ws/runs/{running_run.pk}/", headers=_headers(token=member.raw_token)
        )
        assert (await communicator.connect(timeout=5))[0]
        removed = await sync_to_async(api.delete)(f"/api/projects/{project.pk}/members/bea/")
        assert removed.status_code == 204
        closed = await communicator.receive_output(timeout=5)
        await communicator.wait(timeout=1)
        return closed

    closed = async_to_sync(scenario)()
    assert closed == {"type": "websocket.close", "code": 4403}
