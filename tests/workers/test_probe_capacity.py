"""The probe reads the capacity an environment advertises, for the platform to keep beside the registered limit."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from tandem.contracts import EnvironmentSpec, ProbeRequest, ProbeTimeouts
from tests.conftest import REPO_ROOT
from workers.probe import run_probe

FAST = ProbeTimeouts(url=5, load=10, reset=5, tools=5, step=5, close=5)


class DeclaringEnvironment:
    """An in-process environment that says it serves two episodes at once."""

    max_concurrent_episodes = 2

    def sample_task(self, rng):
        return {}

    async def reset(self, task):
        return "Say anything.\n"

    async def step(self, action):
        return ("", 1.0, True)


@pytest.fixture
def capacity_server_url():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "tests.workers.capacity_server", "--port", str(port),
                               "--capacity", "3", "--advertise"], cwd=REPO_ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"{url}/health", timeout=5).close()
                break
            except OSError:
                time.sleep(0.05)
        yield url
    finally:
        server.kill()
        server.wait(timeout=10)


def _probe(spec: EnvironmentSpec):
    return run_probe(ProbeRequest(probe_id=1, purpose="registration", environment=spec, timeouts=FAST))


def test_the_probe_reports_the_capacity_an_http_server_advertises(capacity_server_url):
    report = _probe(EnvironmentSpec(name="capped", kind="http", settings={"url": capacity_server_url}))

    assert report.passed, report.checks
    assert report.max_concurrent_episodes == 3
    stats = json.loads(urllib.request.urlopen(f"{capacity_server_url}/stats", timeout=5).read())
    assert stats["open"] == 0  # the probe's episode ended


def test_the_probe_reports_the_capacity_a_class_declares():
    report = _probe(EnvironmentSpec(name="declaring", kind="python",
                                    entrypoint=f"{__name__}:DeclaringEnvironment"))

    assert report.passed, report.checks
    assert report.max_concurrent_episodes == 2


def test_an_environment_that_says_nothing_reports_no_capacity():
    from environment_registry.builtin import CALCULATOR

    assert _probe(CALCULATOR).max_concurrent_episodes is None
