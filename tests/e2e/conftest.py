"""A whole Tandem for end-to-end tests: real web server, Celery workers, trainer, Redis, PostgreSQL."""

from __future__ import annotations

import contextlib
import os
import threading
import uuid

import httpx
import psycopg
import pytest
import redis

from environments import http_example_server
from tandem.cli.stack import Credentials, LocalStack, StackConfig
from tandem.contracts import TERMINAL_RUN_STATUSES, TrajectoryRecord
from tandem.runtime.local_ports import free_local_port
from tests.polling import poll_until
from tests.redis_servers import own_redis_server

#: The suite's own PostgreSQL (tests/suite_services.py, which `make test` starts): every stack's database lives there.
ADMIN_DATABASE_URL = os.environ.get("TANDEM_TEST_DATABASE_URL", "")


@contextlib.contextmanager
def fresh_database():
    """A new, empty PostgreSQL database for a stack's own processes, dropped afterwards."""
    name = f"tandem_e2e_{uuid.uuid4().hex[:10]}"
    if not ADMIN_DATABASE_URL:
        pytest.fail("end-to-end tests need the suite's PostgreSQL: TANDEM_TEST_DATABASE_URL is not set "
                    "(`make test` sets it; see tests/suite_services.py)")
    try:
        admin = psycopg.connect(ADMIN_DATABASE_URL, autocommit=True)
    except psycopg.OperationalError as exc:
        pytest.fail(f"end-to-end tests need PostgreSQL at {ADMIN_DATABASE_URL}: {exc}")
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{ADMIN_DATABASE_URL.rsplit('/', 1)[0]}/{name}"
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture(scope="session")
def e2e_database_url():
    with fresh_database() as url:
        yield url


@pytest.fixture(scope="session")
def e2e_redis_url(tmp_path_factory):
    """The session stack's own redis-server: no other stack, suite or session shares its queues."""
    with own_redis_server(tmp_path_factory.mktemp("e2e-redis")) as url:
        yield url


@pytest.fixture(scope="session")
def stack(tmp_path_factory, e2e_database_url, e2e_redis_url):
    config = StackConfig(
        redis_url=e2e_redis_url,
        database_url=e2e_database_url,
        port=free_local_port(),
        workers=2,
        var_dir=tmp_path_factory.mktemp("tandem-var"),
    )
    local = LocalStack(config)
    credentials = local.prepare()
    local.start(credentials)
    yield local, credentials
    local.stop()
    print_log_tails(local, lines=40)


def print_log_tails(stack: LocalStack, *, lines: int) -> None:
    """The last ``lines`` of each process's log: shown on failure by pytest's captured output."""
    for log in sorted(stack.log_dir.glob("*.log")):
        print(f"==== {log.name} (tail) ====")
        print("\n".join(log.read_text(errors="replace").splitlines()[-lines:]))


@contextlib.contextmanager
def private_stack(tmp_path, *, workers: int = 2, extra_env: dict[str, str] | None = None, log_lines: int = 0):
    """A stack of its own (a fresh database, a redis-server of its own), for a test that kills,
    freezes or reconfigures processes without disturbing the session's stack."""
    with own_redis_server(tmp_path / "redis") as redis_url, fresh_database() as database_url:
        stack = LocalStack(StackConfig(redis_url=redis_url, database_url=database_url, port=free_local_port(),
                                       workers=workers, var_dir=tmp_path, extra_env=extra_env or {}))
        try:
            yield stack
        finally:
            # A failed test's stack too: left running, its processes would hold the test's
            # database open and go on writing to it.
            stack.stop()
            if log_lines:
                print_log_tails(stack, lines=log_lines)


def run_ended(stack: LocalStack, api: httpx.Client, run_id: int, *, timeout_s: float) -> dict:
    """The run, once it finished, failed or was cancelled; every process of ``stack`` must live meanwhile."""

    def ended() -> dict | None:
        run = api.get(f"/api/runs/{run_id}/").json()
        return run if run["status"] in TERMINAL_RUN_STATUSES else None

    return poll_until(ended, timeout_s=timeout_s, interval_s=1.0, between=stack.check_alive,
                      what=lambda: f"run {run_id} to end: {api.get(f'/api/runs/{run_id}/').json()}")


def registration_probed(stack: LocalStack, api: httpx.Client, environment_id: int, *,
                        timeout_s: float = 120) -> tuple[dict, dict]:
    """Version 1 of the environment once its probe ended, and its registration probe: the stack's beat may
    already have sent a health probe of a version that passed."""

    def probed() -> dict | None:
        version = api.get(f"/api/environments/{environment_id}/versions/1/").json()
        return version if version["status"] != "pending" else None

    version = poll_until(probed, timeout_s=timeout_s, interval_s=1.0, between=stack.check_alive,
                         what=f"the registration probe of environment {environment_id}")
    [probe] = [probe for probe in version["probes"] if probe["purpose"] == "registration"]
    return version, probe


def dataset_stored(stack: LocalStack, api: httpx.Client, uploaded: httpx.Response, *, timeout_s: float = 300) -> dict:
    """The version an upload's 202 accepted, once the stack's datasets worker has stored its rows."""
    assert uploaded.status_code == 202, uploaded.text
    body = uploaded.json()
    path = f"/api/datasets/{body['id']}/versions/{body['latest_version']['number']}/"

    def stored() -> dict | None:
        version = api.get(path).json()
        assert version["status"] != "failed", version["failure_reason"]
        return version if version["status"] == "ready" else None

    return poll_until(stored, timeout_s=timeout_s, interval_s=0.5, between=stack.check_alive,
                      what=lambda: f"dataset version {path} to be stored: {api.get(path).json()}")


def user_api(stack: LocalStack, credentials: Credentials) -> httpx.Client:
    """The stack's REST API as its user."""
    return httpx.Client(base_url=stack.config.platform_url,
                        headers={"Authorization": f"Token {credentials.user_token}"}, timeout=10)


@contextlib.contextmanager
def example_http_environment(*, latency_ms: float):
    """The example HTTP environment server with ``latency_ms`` per step and tool call; yields its URL."""
    try:
        with http_example_server.running(latency_ms=latency_ms) as url:
            yield url
    except http_example_server.ServerNotHealthyError as exc:
        pytest.fail(str(exc))


def register_http_environment(api: httpx.Client, *, project_id: int, name: str, url: str) -> None:
    """Register the server at ``url`` as ``name``, declaring the tools it serves (the probe checks them)."""
    api.post("/api/environments/", json={
        "project": project_id, "name": name, "kind": "http", "settings": {"url": url, "timeout_s": 30},
        "tools": httpx.get(f"{url}/schema").json()["tools"],
    }).raise_for_status()


@pytest.fixture(scope="session")
def credentials(stack) -> Credentials:
    return stack[1]


class StreamObserver(threading.Thread):
    """Reads the run's stream as entries arrive (no consumer group), before the trainer trims them."""

    def __init__(self, redis_url, stream):
        super().__init__(daemon=True)
        self.redis_url, self.stream = redis_url, stream
        self.records: list[TrajectoryRecord] = []
        self.stop = threading.Event()

    def run(self):
        client = redis.Redis.from_url(self.redis_url)
        last_id = "0-0"
        while not self.stop.is_set():
            for _, entries in client.xread({self.stream: last_id}, block=200) or []:
                for entry_id, fields in entries:
                    last_id = entry_id
                    self.records.append(TrajectoryRecord.from_stream_fields(fields))
