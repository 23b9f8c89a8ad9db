"""No route shows or changes another project's objects, generated from the URL configuration.

Every HTTP route (config.urls) and WebSocket route (runs.routing) that takes an
object id is tried by a user of another project, with every method; the answer
must be 404 (as for an id that does not exist) or, for a method the route does not
allow at all, 405. A new route whose URL kwarg has no builder in KWARG_BUILDERS
fails this test until someone says how to make its object.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AbstractBaseUser
from django.test import Client
from django.urls import get_resolver
from rest_framework.test import APIClient

from accounts.models import ApiToken, Project
from alerts.models import AlertRule, Notification
from alerts.services import alert_fire, alert_rule_create
from checkpoints.models import Checkpoint
from checkpoints.services import checkpoints_report
from config.asgi import application, websocket_urlpatterns
from environment_registry.models import EnvironmentProbe, EnvironmentVersion
from runs.models import Run
from sweeps.models import Sweep
from sweeps.services import sweep_create
from tandem.contracts import CheckpointInfo, CheckpointReport
from telemetry.services import trace_request
from trajectories.services import trajectory_samples_record
from workspaces.services import report_create, saved_view_save

from .route_walk import Route, walk
from .trajectory_builders import calculator_sample


@dataclass
class World:
    """A project with an owner and a second member, an environment and a run."""

    owner: AbstractBaseUser
    member: AbstractBaseUser
    project: Project
    run: Run
    token: ApiToken  # one of the owner's API tokens


# How to make, in World, the object each URL kwarg names.
KWARG_BUILDERS = {
    "run_id": lambda world: world.run.pk,
    "project_id": lambda world: world.project.pk,
    "token_id": lambda world: world.token.pk,
    "username": lambda world: world.member.username,
    "environment_id": lambda world: world.run.environment_id,
    "trajectory_id": lambda world: _sampled_trajectory(world.run),
    "group_id": lambda world: _sampled_group(world.run),
    "trace_id": lambda world: trace_request(user=world.owner, run=world.run, steps=2).pk,
    # With environment_id: the version of the world's environment its run is pinned to.
    "number": lambda world: world.run.environment_version.number,
    "step": lambda world: _reported_checkpoint(world.run),
    # With number: a dataset of the world's project with that many versions.
    "dataset_id": lambda world: _dataset(world),
    # The trainer's dataset routes: a name no config pins (the trainer is refused before it matters).
    "name": lambda world: "support",
    "rule_id": lambda world: _alert_rule(world).pk,
    # One of the owner's notifications: a firing of a rule of the world's project.
    "notification_id": lambda world: _notification(world),
    "sweep_id": lambda world: _sweep(world).pk,
    "view_id": lambda world: saved_view_save(user=world.owner, project=world.project, name=f"view {world.run.pk}",
                                             query="g=tag").pk,
    "report_id": lambda world: report_create(user=world.owner, project=world.project, title="findings",
                                             body="# Findings").pk,
}
# An id (or name) nothing has, to check the outsider's answer is that of a missing object.
MISSING = {"run_id": 10**9, "project_id": 10**9, "token_id": 10**9, "username": "nobody-at-all",
           "environment_id": 10**9, "number": 10**6, "trajectory_id": "no-such-trajectory", "group_id": "no-such-group",
           "trace_id": 10**9, "step": 10**6, "dataset_id": 10**9, "name": "no-such-dataset",
           "rule_id": 10**9, "notification_id": 10**9, "sweep_id": 10**9, "view_id": 10**9, "report_id": 10**9}

# Routes of staff users who work on every project (the trainer): others get 403 on each.
STAFF_ONLY = {
    "/api/trainer/runs/<int:run_id>/heartbeat/",
    "/api/trainer/runs/<int:run_id>/telemetry/",
    "/api/trainer/runs/<int:run_id>/trajectories/",
    "/api/trainer/runs/<int:run_id>/traces/<int:trace_id>/",
    "/api/trainer/runs/<int:run_id>/checkpoints/",
    "/api/trainer/runs/<int:run_id>/evaluations/",
    "/api/trainer/runs/<int:run_id>/datasets/<str:name>/versions/<int:number>/rows/",
}
# Django's admin is for staff, who see everything by design; it has its own login.
SKIPPED_NAMESPACES = {"admin"}

# OPTIONS is left out: DRF answers it from the view class alone, the same for any id
# (test_options_answers_the_same_for_any_id proves it).
METHODS = ["get", "post", "put", "patch", "delete"]


def _sampled_trajectory(run: Run) -> str:
    """The id of a new trajectory sample of ``run``."""
    sample = calculator_sample(run.pk)
    trajectory_samples_record(run=run, samples=[sample])
    return sample.trajectory_id


def _sampled_group(run: Run) -> str:
    """The group id of a new trajectory sample of ``run``."""
    sample = calculator_sample(run.pk)
    trajectory_samples_record(run=run, samples=[sample])
    return sample.group_id


def _dataset(world: World) -> int:
    """The id of a dataset of the world's project with as many versions as its environment has."""
    from dataset_registry.services import dataset_upload, dataset_version_store

    row = b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}\n'
    for _ in range(world.run.environment_version.number):
        version = dataset_upload(user=world.owner, project=world.project, name="support",
                                 file=io.BytesIO(row), file_name="rows.jsonl")
        dataset_version_store(version_id=version.pk)  # the datasets worker's part
    return version.dataset_id


def _alert_rule(world: World) -> AlertRule:
    return alert_rule_create(user=world.owner, project=world.project, name=f"failures {world.run.pk}",
                             kind=AlertRule.Kind.RUN_FAILED)


def _sweep(world: World) -> Sweep:
    """A sweep of the world's project (its first trials start only once it commits: none here)."""
    return sweep_create(user=world.owner, project=world.project, environment=world.run.environment.name,
                        name=f"sweep {world.run.pk}", base_config={"sft_steps": 0, "rl_steps": 2},
                        search_space={"rl_learning_rate": {"type": "float", "low": 1e-5, "high": 1e-3}},
                        sampler="random", metric="reward_mean", goal="maximize", max_runs=2, concurrency=1)


def _notification(world: World) -> int:
    firing = alert_fire(rule=_alert_rule(world), subject=f"run:{world.run.pk}", text="Run failed.", details={},
                        run_id=world.run.pk)
    return Notification.objects.get(firing=firing, user=world.owner).pk


def _reported_checkpoint(run: Run) -> int:
    """The step of a checkpoint of ``run`` as its trainer reports it (its files are never read here)."""
    info = CheckpointInfo(step=5, policy_version=1, path=f"/nonexistent/run-{run.pk}/5", size_bytes=10)
    checkpoints_report(run=run, report=CheckpointReport(checkpoints=[info]))
    return info.step


def _object_routes() -> list[Route]:
    return [
        route
        for route in walk(get_resolver())
        if route.kwargs and route.namespace not in SKIPPED_NAMESPACES
    ]


@pytest.fixture
def make_world(make_user, make_project, make_environment, make_run):
    def make() -> World:
        owner, member = make_user(), make_user()
        project = make_project(owner=owner, members=[member])
        run = make_run(project, environment=make_environment(project))
        return World(
            owner=owner,
            member=member,
            project=project,
            run=run,
            token=ApiToken.objects.get(user=owner),
        )

    return make


@pytest.fixture
def outsider(make_user, make_project, make_environment, make_run):
    """A member (owner, even) of a project of their own, with a run there."""
    user = make_user()
    project = make_project(owner=user)
    make_run(project, environment=make_environment(project))
    return user


def _client_for(user, route: Route):
    """The API by token, as scripts use it; pages by session, as browsers do."""
    if route.path.startswith("/api/"):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {user.raw_token}")
        return client
    client = Client()
    client.force_login(user)
    return client


def _url(route: Route, values: dict) -> str:
    return re.sub(r"<(?:\w+:)?(\w+)>", lambda match: str(values[match.group(1)]), route.path)


def _snapshot(world: World) -> tuple:
    """What a request could change about the world's objects."""
    return (
        Run.objects.filter(pk=world.run.pk).values_list("status", "name").first(),
        ApiToken.objects.filter(pk=world.token.pk).values_list("name", "last_used_at").first(),
        sorted(world.project.memberships.values_list("user__username", "role")),
        Project.objects.filter(pk=world.project.pk).values_list("name").first(),
        sorted(EnvironmentProbe.objects.filter(version__environment=world.run.environment_id)
               .values_list("pk", flat=True)),
        sorted(EnvironmentVersion.objects.filter(environment=world.run.environment_id)
               .values_list("number", flat=True)),
        sorted(Checkpoint.objects.filter(run=world.run).values_list("step", "status", "export_status")),
        sorted(AlertRule.objects.filter(project=world.project).values_list("name", "kind", "enabled")),
        sorted(Notification.objects.filter(firing__project=world.project).values_list("pk", "read_at")),
    )


def _values(route: Route, world: World | None) -> dict:
    missing = [kwarg for kwarg in route.kwargs if kwarg not in KWARG_BUILDERS]
    assert not missing, (
        f"{route.path} takes {missing}: add a builder to KWARG_BUILDERS so that "
        "the isolation test covers it"
    )
    if world is None:
        return {kwarg: MISSING[kwarg] for kwarg in route.kwargs}
    return {kwarg: KWARG_BUILDERS[kwarg](world) for kwarg in route.kwargs}


def _request(client, method: str, url: str):
    body = {} if method in {"post", "put", "patch"} else None
    if isinstance(client, APIClient):
        return getattr(client, method)(url, body, format="json")
    return getattr(client, method)(url, body or {})


def test_the_walk_finds_the_object_routes():
    paths = {route.path for route in _object_routes()}
    assert {
        "/api/runs/<int:run_id>/",
        "/api/runs/<int:run_id>/metrics/",
        "/api/runs/<int:run_id>/cancel/",
        "/api/projects/<int:project_id>/members/<str:username>/",
        "/api/tokens/<int:token_id>/",
        "/runs/<int:run_id>/",
        "/tokens/<int:token_id>/revoke/",
    } <= paths
    assert paths >= STAFF_ONLY


@pytest.mark.parametrize("route", _object_routes(), ids=lambda route: route.path)
def test_another_projects_user_gets_404_for_every_method(route, make_world, outsider):
    allowed = []
    for method in METHODS:
        world = make_world()  # fresh, since the owner's own request may change it
        url = _url(route, _values(route, world))
        before = _snapshot(world)
        answer = _request(_client_for(outsider, route), method, url)
        assert _snapshot(world) == before, (method, url, "the outsider changed something")
        missing = _request(_client_for(outsider, route), method, _url(route, _values(route, None)))
        owner_answer = _request(_client_for(world.owner, route), method, url)
        if owner_answer.status_code == 405:
            assert answer.status_code in {404, 405}, (method, url, answer.status_code)
            continue
        allowed.append(method)
        expected = 403 if route.path in STAFF_ONLY else 404
        assert answer.status_code == expected, (method, url, answer.status_code)
        assert missing.status_code == expected, (method, url, "missing", missing.status_code)
    assert allowed, f"no method of {route.path} answered its owner; is the route reachable?"


def test_options_answers_the_same_for_any_id(make_world, outsider):
    world = make_world()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {outsider.raw_token}")

    real = client.options(f"/api/runs/{world.run.pk}/")
    missing = client.options(f"/api/runs/{MISSING['run_id']}/")

    assert real.status_code == missing.status_code
    assert real.json() == missing.json()
    assert world.run.name not in real.content.decode()


def _websocket_routes(*, of_objects: bool) -> list[Route]:
    """The sockets the ASGI application serves: those of an object (a run: the kwargs name it), or a user's
    own (no kwargs: what they send is the connecting user's, e.g. the unread count)."""
    routes = [Route(path="/" + str(p.pattern), pattern=p, namespace=None) for p in websocket_urlpatterns]
    return [route for route in routes if bool(route.kwargs) == of_objects]


def _connects(path: str, user) -> bool:
    return _first_message(path, user)[0]


def _first_message(path: str, user) -> tuple[bool, dict | None]:
    """Whether ``user`` (by token) connects to ``path``, and the first message it sends at once if any."""
    async def scenario():
        headers = [(b"host", b"testserver"), (b"authorization", f"Token {user.raw_token}".encode())]
        communicator = WebsocketCommunicator(application, path, headers=headers)
        connected, _ = await communicator.connect(timeout=5)
        message = None
        if connected and not await communicator.receive_nothing(timeout=0.5):
            message = await communicator.receive_json_from(timeout=1)
        await communicator.disconnect(timeout=1 if connected else 0.1)
        return connected, message

    return async_to_sync(scenario)()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("route", _websocket_routes(of_objects=True), ids=lambda route: route.path)
def test_another_projects_user_cannot_open_a_websocket(route, make_world, outsider):
    world = make_world()
    url = _url(route, _values(route, world))

    assert not _connects(url, outsider)
    assert _connects(url, world.owner)  # the route itself works


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("route", _websocket_routes(of_objects=False), ids=lambda route: route.path)
def test_a_users_own_socket_tells_them_only_their_own(route, make_world, outsider):
    world = make_world()
    rule = alert_rule_create(user=world.owner, project=world.project, name="watch", kind="run_failed")
    alert_fire(rule=rule, subject=f"run:{world.run.pk}", text="failed", details={}, run_id=world.run.pk)

    assert _first_message(route.path, world.owner) == (True, {"type": "notifications.unread", "unread": 1})
    assert _first_message(route.path, outsider) == (True, {"type": "notifications.unread", "unread": 0})
