"""A real platform (uvicorn, PostgreSQL, Redis) for the SDK's and the CLI's tests, and the trainer's side of it."""

from __future__ import annotations

import time
from dataclasses import dataclass

import httpx
import pytest
import redis

from tandem.cli.stack import Credentials, LocalStack, StackConfig
from tandem.contracts import TRAINER_HEADER
from tandem.runtime.local_ports import free_local_port
from tandem.sdk.client import TandemClient
from tests.e2e.conftest import fresh_database
from tests.platform.builders import step_event
from tests.redis_servers import own_redis_server


@dataclass
class Platform:
    stack: LocalStack
    credentials: Credentials

    @property
    def url(self) -> str:
        return self.stack.config.platform_url


@pytest.fixture(scope="session")
def platform(tmp_path_factory) -> Platform:
    """The stack lives as long as this pytest process, so it has a Redis of its own: on the suite's, its
    probes, platform and datasets workers took the tasks of later tests' own worker processes."""
    with own_redis_server(tmp_path_factory.mktemp("platform-redis")) as redis_url, \
            fresh_database() as database_url:
        config = StackConfig(redis_url=redis_url, database_url=database_url, port=free_local_port(),
                             workers=1, var_dir=tmp_path_factory.mktemp("tandem-var"))
        stack = LocalStack(config)
        credentials = stack.prepare()
        stack.start_web()
        # A rollout worker and the platform worker: environments get probed, as they are for real.
        stack.start_platform_worker()
        stack.start_platform_queue_workers()
        stack.start_workers()
        yield Platform(stack, credentials)
        stack.stop()
        print("==== web.log (tail) ====")
        print("\n".join((stack.log_dir / "web.log").read_text(errors="replace").splitlines()[-40:]))


@pytest.fixture
def platform_redis(platform) -> redis.Redis:
    """The platform's Redis, where the trainer writes what the API reads (evaluation progress, say)."""
    client = redis.Redis.from_url(platform.stack.config.redis_url)
    yield client
    client.close()


@pytest.fixture
def client(platform) -> TandemClient:
    with TandemClient(platform.url, platform.credentials.user_token) as tandem:
        yield tandem


class Trainer:
    """The trainer's side of the API, as trainer/ speaks it: claim, heartbeat, telemetry."""

    def __init__(self, platform: Platform, user_client: TandemClient):
        self.worker = "test-host:1"
        self.http = httpx.Client(base_url=platform.url, timeout=10,
                                 headers={"Authorization": f"Token {platform.credentials.trainer_token}",
                                          TRAINER_HEADER: self.worker})
        self.user_client = user_client
        # The runs this trainer claimed: it writes only to those (the platform checks the holder).
        self.holding: set[int] = set()

    def claim(self, run_id: int) -> None:
        """Claim exactly this run: claims take the oldest queued run, so others are cancelled first."""
        for run in list(self.user_client.runs.list(status="queued")):
            if run.id != run_id:
                self.user_client.runs.cancel(run.id)
        response = self.http.post("/api/trainer/claim/", json={"worker": self.worker})
        assert response.status_code == 200, response.text
        assert response.json()["run"]["id"] == run_id
        self.holding.add(run_id)
        self.heartbeat(run_id)

    def heartbeat(self, run_id: int, status: str | None = "running", **fields) -> str:
        response = self.http.post(f"/api/trainer/runs/{run_id}/heartbeat/",
                                  json={"worker": self.worker, "status": status, **fields})
        assert response.status_code == 200, response.text
        return response.json()["status"]

    def post_steps(self, run_id: int, steps: range | list[int]) -> None:
        """Post step events for ``run_id``, claiming it first if this trainer does not hold it yet."""
        if run_id not in self.holding:
            self.claim(run_id)
        response = self.http.post(f"/api/trainer/runs/{run_id}/telemetry/",
                                  json={"events": [step_event(run_id, step) for step in steps]})
        assert response.status_code == 202, response.text


@pytest.fixture
def trainer(platform, client) -> Trainer:
    trainer = Trainer(platform, client)
    yield trainer
    trainer.http.close()


def wait_until(condition, *, timeout_s: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)
