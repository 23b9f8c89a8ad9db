"""A whole Tandem spread over hosts of a test's own (tests/network_hosts.py), as a deployment spreads it.

- ``host-a``: Redis (a redis-server of its own, on host-a's address), the web
  server, the platform's worker, and PostgreSQL through its Unix socket (the
  suite's own server, tests/suite_services.py: the socket is a file, not an address).
- the producer hosts (``host-b``, ``host-c``, ...): one rollout worker each,
  which reaches Redis and the environment servers over the network only. The
  stack's ``var`` directory (the trainer's checkpoints and weights among it)
  is hidden there behind an empty tmpfs: they share no storage with the trainer.
- ``host-d``: the trainer, which reaches the platform and Redis over the network.

The test process is the outside: it reaches host-a through its own cable to the switch.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from urllib.parse import quote, urlsplit

import httpx
import pytest
import redis

from tandem.cli.stack import LocalStack, StackConfig
from tests.e2e.conftest import fresh_database, print_log_tails
from tests.network_hosts import Host, Network, network
from tests.polling import poll_until
from tests.processes import stop_processes


def _database_over_the_socket(database_url: str) -> str:
    """``database_url`` (on the suite's PostgreSQL, over TCP on loopback) reached through its Unix socket."""
    socket_dir = os.environ.get("TANDEM_TEST_POSTGRES_SOCKET_DIR", "")
    if not socket_dir:
        pytest.fail("multi-host tests reach the suite's PostgreSQL through its socket: TANDEM_TEST_POSTGRES_SOCKET_DIR "
                    "is not set (`make test` sets it; see tests/suite_services.py)")
    address = urlsplit(database_url)
    return f"postgresql://{address.username}@{quote(socket_dir, safe='')}:{address.port}{address.path}"

PLATFORM_HOST = "host-a"
TRAINER_HOST = "host-d"
REDIS_PORT = 6379
WEB_PORT = 8000
ENVIRONMENT_PORT = 8765


class MultiHostStack(LocalStack):
    """LocalStack whose processes run each on its host of ``net``: worker-i on ``producer_hosts[i]``."""

    def __init__(self, net: Network, config: StackConfig, *, producer_hosts: Sequence[str]):
        super().__init__(config)
        self.net = net
        self.producer_hosts = list(producer_hosts)

    def host_of(self, process_name: str) -> Host:
        if process_name.startswith("worker-"):
            return self.net[self.producer_hosts[int(process_name.split("-")[1])]]
        if process_name == "probe-worker":  # a producer too: it runs environment code, beside the first worker
            return self.net[self.producer_hosts[0]]
        if process_name.startswith("trainer"):
            return self.net[TRAINER_HOST]
        return self.net[PLATFORM_HOST]

    def _spawn(self, name: str, command: list[str], *, cwd: Path | None = None, env: dict | None = None) -> None:
        host = self.host_of(name)
        env = dict(env or self.env())
        hidden: tuple[Path, ...] = ()
        if host.name != PLATFORM_HOST:
            env.pop("DATABASE_URL", None)  # only the platform's processes use the database
        if name.startswith("worker-") or name == "probe-worker":
            hidden = (self.config.var_dir,)
        super()._spawn(name, host.command(command, hidden=hidden), cwd=cwd or _REPO_ROOT, env=env)
        self._supervised[name].command = command  # a restart goes through here again


_REPO_ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def multi_host_stack(tmp_path: Path, *, producer_hosts: Sequence[str] = ("host-b", "host-c"),
                     worker_concurrency: int = 4, environment_latency_ms: float = 0.0,
                     environment: str | None = None, environment_settings: dict | None = None,
                     extra_hosts: Sequence[str] = (), extra_env: dict[str, str] | None = None,
                     log_lines: int = 60) -> Iterator[tuple[MultiHostStack, str]]:
    """The stack on hosts A (platform, Redis), the producer hosts and D (trainer), not started yet.

    Also serves the example HTTP environment on host A with ``environment_latency_ms`` (the
    calculator, or ``environment``, ``module:Class`` built with ``environment_settings``); yields
    the stack and that environment's URL. ``extra_hosts``: more hosts on the network, with nothing
    started on them.
    """
    names = [PLATFORM_HOST, *producer_hosts, TRAINER_HOST, *extra_hosts]
    with network(names) as net, fresh_database() as database_url:
        platform_host = net[PLATFORM_HOST]
        redis_dir = tmp_path / "redis"
        redis_dir.mkdir()
        redis_url = f"redis://{platform_host.address}:{REDIS_PORT}/0"
        with (redis_dir / "redis.log").open("ab") as redis_log:
            redis_server = subprocess.Popen(
                platform_host.command(["redis-server", "--port", str(REDIS_PORT), "--bind", platform_host.address,
                                       "--protected-mode", "no", "--save", "", "--appendonly", "no",
                                       "--dir", str(redis_dir)]),
                stdout=redis_log, stderr=subprocess.STDOUT)
        environment_server = subprocess.Popen(
            platform_host.command([sys.executable, "-m", "environments.http_example_server",
                                   "--host", platform_host.address, "--port", str(ENVIRONMENT_PORT),
                                   "--latency-ms", str(environment_latency_ms),
                                   *(["--environment", environment, "--settings",
                                      json.dumps(environment_settings or {})] if environment else [])]),
            cwd=_REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stack = None
        try:
            _wait_for_redis(redis_url, redis_server)
            config = StackConfig(
                redis_url=redis_url,
                # PostgreSQL through its socket: host-a's processes reach it without a network.
                database_url=_database_over_the_socket(database_url),
                host=platform_host.address, port=WEB_PORT, workers=len(producer_hosts),
                worker_concurrency=worker_concurrency, var_dir=tmp_path / "var",
                extra_env={
                    "ALLOWED_HOSTS": platform_host.address,
                    # Environments may live on this network's hosts, and nowhere else.
                    "TANDEM_ENVIRONMENT_URL_ALLOWLIST": str(net.subnet),
                    **(extra_env or {}),
                },
            )
            stack = MultiHostStack(net, config, producer_hosts=producer_hosts)
            environment_url = platform_host.url(ENVIRONMENT_PORT)
            poll_until(lambda: httpx.get(f"{environment_url}/health", timeout=1).json() == {"status": "ok"},
                       timeout_s=60, interval_s=0.2, ignoring=(httpx.HTTPError,),
                       what=f"the example environment server at {environment_url}")
            yield stack, environment_url
        finally:
            if stack is not None:
                stack.stop()
                if log_lines:
                    print_log_tails(stack, lines=log_lines)
            stop_processes([environment_server, redis_server])


def _wait_for_redis(redis_url: str, server: subprocess.Popen) -> None:
    def alive() -> None:
        assert server.poll() is None, "the redis-server of host-a exited"

    poll_until(lambda: redis.Redis.from_url(redis_url, socket_connect_timeout=1).ping(), timeout_s=30,
               interval_s=0.1, between=alive, ignoring=(redis.ConnectionError,), what=f"Redis at {redis_url}")
