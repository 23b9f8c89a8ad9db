"""Issue 28, finding 16: a run's WebSocket closes (4401) once what it authenticated with is no longer valid.

Before, a socket opened with a token kept receiving the run's updates after the token was
revoked: the consumer's re-check asked only whether the user may see the run. Now it also
asks whether the token still exists, or the session is still logged in, and a revoked
token closes its user's sockets at once. Real ASGI app, real Redis channel layer.
"""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

import runs.consumers
from config.asgi import application
from runs.realtime import run_broadcast

pytestmark = pytest.mark.django_db(transaction=True)

UNAUTHENTICATED = {"type": "websocket.close", "code": 4401}


def _status(run, status: str) -> list[dict]:
    return [{"type": "status", "run": run.pk, "status": status}]


def test_a_socket_opened_with_a_token_closes_when_the_token_is_revoked(running_run, api):
    created = api.post("/api/tokens/", {"name": "socket"}, format="json").json()

    async def scenario():
        communicator = WebsocketCommunicator(application, f"/ws/runs/{running_run.pk}/", headers=[
            (b"host", b"testserver"), (b"authorization", f"Token {created['token']}".encode())])
        assert (await communicator.connect(timeout=5))[0]
        await sync_to_async(run_broadcast)(running_run.pk, _status(running_run, "before"))
        before = await communicator.receive_json_from(timeout=5)
        revoked = await sync_to_async(api.delete)(f"/api/tokens/{created['id']}/")
        assert revoked.status_code == 204
        await sync_to_async(run_broadcast)(running_run.pk, _status(running_run, "after"))
        first_after = await communicator.receive_output(timeout=5)
        await sync_to_async(run_broadcast)(running_run.pk, _status(running_run, "later"))
        nothing_more = await communicator.receive_nothing()
        await communicator.wait(timeout=1)
        return before, first_after, nothing_more

    before, first_after, nothing_more = async_to_sync(scenario)()

    assert before["status"] == "before"
    assert first_after == UNAUTHENTICATED, f"a revoked token's socket received {first_after}"
    assert nothing_more


def test_a_socket_of_a_session_closes_at_its_next_update_after_logging_out(running_run, user, monkeypatch):
    # Every update re-checks (instead of one in ACCESS_RECHECK_S): the logout is seen at the next one.
    monkeypatch.setattr(runs.consumers, "ACCESS_RECHECK_S", 0.0)
    browser = Client()
    browser.force_login(user)
    session = browser.cookies["sessionid"].value

    async def scenario():
        communicator = WebsocketCommunicator(application, f"/ws/runs/{running_run.pk}/", headers=[
            (b"host", b"testserver"), (b"origin", b"http://testserver"),
            (b"cookie", f"sessionid={session}".encode())])
        assert (await communicator.connect(timeout=5))[0]
        await sync_to_async(run_broadcast)(running_run.pk, _status(running_run, "before"))
        before = await communicator.receive_json_from(timeout=5)
        logged_out = await sync_to_async(browser.post)("/logout/")
        assert logged_out.status_code == 302
        await sync_to_async(run_broadcast)(running_run.pk, _status(running_run, "after"))
        first_after = await communicator.receive_output(timeout=5)
        await communicator.wait(timeout=1)
        return before, first_after

    before, first_after = async_to_sync(scenario)()

    assert before["status"] == "before"
    assert first_after == UNAUTHENTICATED, f"a logged-out session's socket received {first_after}"


def test_a_socket_whose_token_is_still_valid_keeps_receiving(running_run, user, api, monkeypatch):
    monkeypatch.setattr(runs.consumers, "ACCESS_RECHECK_S", 0.0)
    other = api.post("/api/tokens/", {"name": "other"}, format="json").json()

    async def scenario():
        communicator = WebsocketCommunicator(application, f"/ws/runs/{running_run.pk}/", headers=[
            (b"host", b"testserver"), (b"authorization", f"Token {user.raw_token}".encode())])
        assert (await communicator.connect(timeout=5))[0]
        # Revoking another of the user's tokens re-checks this socket, which stays open.
        assert (await sync_to_async(api.delete)(f"/api/tokens/{other['id']}/")).status_code == 204
        await sync_to_async(run_broadcast)(running_run.pk, _status(running_run, "after"))
        received = await communicator.receive_json_from(timeout=5)
        await communicator.disconnect()
        return received

    assert async_to_sync(scenario)()["status"] == "after"
