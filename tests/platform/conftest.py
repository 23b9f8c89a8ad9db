"""Factories and API clients for the platform's tests (PostgreSQL and Redis, both real)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from django.db import connection
from rest_framework.test import APIClient

from accounts.models import Membership
from accounts.services import (
    membership_add,
    project_create,
    user_create_with_token,
    user_make_trainer,
)
from environment_registry.builtin import CALCULATOR
from environment_registry.services import environment_probe_record, environment_register
from runs.services import run_claim_next, run_create, run_heartbeat
from tandem.contracts import ProbeCheck, ProbeReport, TrainerHeartbeat
from tandem.runtime.local_ports import free_local_port
from tests.processes import stop_process

_serial = itertools.count(1)
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def make_user(db):
    def make(username: str | None = None, *, is_staff: bool = False, password: str = "pw",
             trainer: bool = False):
        user, raw_token = user_create_with_token(
            username=username or f"user{next(_serial)}", password=password, is_staff=is_staff
        )
        if trainer:
            user_make_trainer(user=user)
        # Only the hash is stored; tests keep the raw value on the object they were handed.
        user.raw_token = raw_token
        return user

    return make


@pytest.fixture
def make_project(make_user):
    def make(owner=None, name: str | None = None, *, members=(), viewers=()):
        project = project_create(owner=owner or make_user(), name=name or f"project{next(_serial)}")
        for user in members:
            membership_add(project=project, user=user, role=Membership.Role.MEMBER)
        for user in viewers:
            membership_add(project=project, user=user, role=Membership.Role.VIEWER)
        return project

    return make


def probe_report(probe, *, failed_check: str | None = None) -> ProbeReport:
    """A worker's report on ``probe``: every check passed, or ``failed_check`` failed."""
    checks = tuple(
        ProbeCheck(name=name, status="failed" if name == failed_check else "passed",
                   message="boom" if name == failed_check else "ok", latency_s=0.01, timeout_s=5.0)
        for name in ("load", "reset", "step")
    )
    return ProbeReport(probe_id=probe.pk, checks=checks, worker="test:1", started_at=0.0,
                       finished_at=0.05)


@pytest.fixture
def make_environment():
    """An environment whose version 1 passed its probe (``probed=False``: still pending)."""

    def make(project, spec=CALCULATOR, *, probed: bool = True):
        version = environment_register(user=project.owner, project=project, spec=spec)
        if probed:
            environment_probe_record(report=probe_report(version.probes.get()))
        return version.environment

    return make


@pytest.fixture
def make_run(make_project, make_environment):
    def make(project=None, *, environment=None, config=None, name: str = ""):
        project = project or make_project()
        environment = environment or make_environment(project)
        return run_create(
            user=project.owner,
            project=project,
            environment_name=environment.name,
            config=config if config is not None else {"sft_steps": 2, "rl_steps": 2},
            name=name,
        )

    return make


@pytest.fixture
def user(make_user):
    return make_user("alice")


@pytest.fixture
def project(make_project, user):
    return make_project(owner=user, name="alice-project")


@pytest.fixture
def environment(make_environment, project):
    return make_environment(project)


@pytest.fixture
def client_for():
    """An API client that authenticates with the user's token, as scripts do."""

    def make(user) -> APIClient:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {user.raw_token}")
        return client

    return make


@pytest.fixture
def api(client_for, user) -> APIClient:
    return client_for(user)


@pytest.fixture
def trainer(make_user):
    return make_user("tandem-trainer", password=None, trainer=True)


# The trainer that claims the runs of these tests (``running_run``), as its writes name it.
TRAINER_NAME = "trainer-host:1"


@pytest.fixture
def trainer_api(trainer) -> APIClient:
    """The trainer's client: its token, and its name on every request (the holder check of its writes)."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {trainer.raw_token}", HTTP_X_TANDEM_TRAINER=TRAINER_NAME)
    return client


@pytest.fixture
def running_run(make_run, project, environment):
    """A run of alice's project that a trainer has claimed."""
    run = make_run(project, environment=environment)
    claimed = run_claim_next(worker=TRAINER_NAME)
    assert claimed is not None and claimed.pk == run.pk
    # The trainer's first heartbeat moves it from starting to running.
    return run_heartbeat(run=claimed, heartbeat=TrainerHeartbeat(worker=TRAINER_NAME))


@pytest.fixture
def server(transactional_db, tmp_path):
    """uvicorn serving the platform from the test database, as it is served for real."""
    db = connection.settings_dict
    port = free_local_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "TANDEM_TEST_DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "PYTHONPATH": str(REPO_ROOT),
    }
    log = tmp_path / "uvicorn.log"
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "config.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            cwd=REPO_ROOT / "platform",
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, log.read_text()
            try:
                if httpx.get(f"{base}/api/", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"uvicorn did not start:\n{log.read_text()}"
            time.sleep(0.1)
        yield base
    finally:
        # A graceful shutdown waits for open WebSockets; on a loaded machine that can outlast
        # the test, which is over: then it is killed.
        stop_process(process)
        print(log.read_text()[-4000:])  # shown when the test fails


@pytest.fixture
def keyed_version(project):
    """A ready version of an environment with the secret setting ``api_key``
    (tests.workers.secret_environments.KeyedEnvironment)."""
    from tandem.contracts import EnvironmentSpec
    from tests.workers.secret_environments import API_KEY

    spec = EnvironmentSpec(name="keyed", kind="python", entrypoint="tests.workers.secret_environments:KeyedEnvironment",
                           settings={"greeting": "hi"})
    version = environment_register(user=project.owner, project=project, spec=spec, secret_settings={"api_key": API_KEY})
    environment_probe_record(report=probe_report(version.probes.get()))
    return version
