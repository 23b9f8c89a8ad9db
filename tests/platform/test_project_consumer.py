"""A project's WebSocket (the workspace's and reports' live metrics), through the real ASGI app and the real
Redis channel layer: a member hears every run's steps, nobody else connects, and a member removed from
the project has the socket closed."""

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator

from config.asgi import application

from .builders import step_event
from .test_run_consumer import _connects, _headers, connects_to

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_member_hears_the_steps_of_each_run_of_the_project(running_run, user, trainer_api, project):
    async def scenario():
        communicator = WebsocketCommunicator(application, f"/ws/projects/{project.pk}/",
                                             headers=_headers(token=user.raw_token))
        assert (await communicator.connect(timeout=5))[0]
        posted = await sync_to_async(trainer_api.post)(
            f"/api/trainer/runs/{running_run.pk}/telemetry/", {"events": [step_event(running_run.pk, 9)]},
            format="json")
        assert posted.status_code == 202
        message = await communicator.receive_json_from(timeout=5)
        await communicator.disconnect()
        return message

    message = async_to_sync(scenario)()
    assert (message["type"], message["run"], message["step"]) == ("metrics", running_run.pk, 9)
    assert message["values"]["reward_mean"] == pytest.approx(0.9)


def test_only_the_projects_members_connect(running_run, user, make_user, project):
    path = f"/ws/projects/{project.pk}/"
    assert connects_to(path, _headers(token=user.raw_token))
    assert not connects_to(path, _headers(token=make_user().raw_token))
    assert not connects_to(path, _headers())
    assert _connects(running_run, _headers(token=user.raw_token))  # the run's own socket is unchanged


def test_a_member_removed_from_the_project_has_the_project_socket_closed(user, api, make_user, project):
    member = make_user("bea")
    assert api.post(f"/api/projects/{project.pk}/members/", {"username": "bea", "role": "viewer"},
                    format="json").status_code == 201

    async def scenario():
        communicator = WebsocketCommunicator(application, f"/ws/projects/{project.pk}/",
                                             headers=_headers(token=member.raw_token))
        assert (await communicator.connect(timeout=5))[0]
        removed = await sync_to_async(api.delete)(f"/api/projects/{project.pk}/members/bea/")
        assert removed.status_code == 204
        closed = await communicator.receive_output(timeout=5)
        await communicator.wait(timeout=1)
        return closed

    assert async_to_sync(scenario)() == {"type": "websocket.close", "code": 4403}
