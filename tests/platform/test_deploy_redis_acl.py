"""Finding 5 of the security audit: the compose file's Redis ACL, loaded by a real redis-server.

A throwaway redis-server on a free loopback port reads the ACL file that
deploy/redis/write-acl.sh writes for docker-compose.yml; each role's user is
then used as its service would use it.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tandem.contracts import keys, trajectory_stream, weights_key
from tandem.runtime.local_ports import free_local_port
from tests.polling import poll_until
from tests.processes import stop_process
from tests.redis_servers import start_redis_server

REPO_ROOT = Path(__file__).resolve().parents[2]

PASSWORDS = {variable: secrets.token_hex(24) for variable in
             ("REDIS_PASSWORD", "REDIS_PLATFORM_PASSWORD", "REDIS_WORKER_PASSWORD", "REDIS_TRAINER_PASSWORD")}
USERS = {"admin": "REDIS_PASSWORD", "tandem-platform": "REDIS_PLATFORM_PASSWORD",
         "tandem-worker": "REDIS_WORKER_PASSWORD", "tandem-trainer": "REDIS_TRAINER_PASSWORD"}
ROLES = ("tandem-platform", "tandem-worker", "tandem-trainer")


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory):
    """The port of a redis-server started with the compose file's ACL; stopped after the module."""
    directory = tmp_path_factory.mktemp("redis-acl")
    acl_file = directory / "users.acl"
    written = subprocess.run(["sh", str(REPO_ROOT / "deploy/redis/write-acl.sh"), str(acl_file)],
                             env={"PATH": os.environ["PATH"], **PASSWORDS}, capture_output=True,
                             text=True, timeout=30)
    assert written.returncode == 0, written.stderr
    port = free_local_port()
    admin = _client(port, "admin")
    server = start_redis_server(port, directory, "--save", "", "--appendonly", "no", "--aclfile", str(acl_file),
                                ready=admin.ping)
    try:
        yield port
    finally:
        stop_process(server)


def _url(port: int, user: str) -> str:
    return f"redis://{user}:{PASSWORDS[USERS[user]]}@127.0.0.1:{port}/0"


def _client(port: int, user: str) -> redis.Redis:
    return redis.Redis.from_url(_url(port, user), socket_timeout=5, socket_connect_timeout=5)


@pytest.fixture
def admin(acl_redis):
    client = _client(acl_redis, "admin")
    client.acl_log_reset()
    yield client
    client.close()


def test_the_worker_user_writes_run_streams_but_cannot_flush_reconfigure_or_list_keys(acl_redis, admin):
    worker = _client(acl_redis, "tandem-worker")
    stream = trajectory_stream(91)
    assert worker.xadd(stream, {"record": "{}"})
    assert worker.xlen(stream) == 1
    assert worker.hget(weights_key(91), "version") is None
    for command in (("FLUSHALL",), ("FLUSHDB",), ("CONFIG", "GET", "*"), ("CONFIG", "SET", "appendonly", "no"),
                    ("KEYS", "*"), ("SHUTDOWN",), ("ACL", "LIST"),
                    ("MODULE", "LIST"), ("MONITOR",), ("INFO",)):
        with pytest.raises(redis.exceptions.NoPermissionError):
            worker.execute_command(*command)
    assert admin.xlen(stream) == 1  # nothing was flushed
    admin.delete(stream)


@pytest.mark.parametrize("user", ROLES)
def test_no_application_user_may_run_server_wide_commands(acl_redis, admin, user):
    for command in (("FLUSHALL",), ("FLUSHDB",), ("CONFIG", "GET", "*"), ("CONFIG", "SET", "save", ""),
                    ("DEBUG", "SLEEP", "0"), ("SHUTDOWN",), ("KEYS", "*"), ("MODULE", "LOAD", "/x.so"),
                    ("ACL", "SETUSER", user, "+@all"), ("SAVE",), ("REPLICAOF", "NO", "ONE"), ("MONITOR",),
                    ("CLIENT", "KILL", "ID", "1")):
        answer = admin.execute_command("ACL", "DRYRUN", user, *command)
        assert b"no permissions" in answer, (user, command, answer)


def test_the_default_user_is_off(acl_redis):
    anonymous = redis.Redis(host="127.0.0.1", port=acl_redis, socket_timeout=5)
    with pytest.raises(redis.exceptions.AuthenticationError):
        anonymous.ping()


def _every_contract_key() -> list[str]:
    """A key of every kind tandem/contracts/keys.py names (ids made up): a new kind must be in the ACL."""
    made = []
    for name, function in inspect.getmembers(keys, inspect.isfunction):
        if name.startswith("_") or function.__module__ != keys.__name__ or name.endswith("_field"):
            continue
        arguments = [7 if parameter.endswith("_id") and parameter != "task_id" else "task-7"
                     for parameter in inspect.signature(function).parameters]
        value = function(*arguments)
        made += [value] if isinstance(value, str) else list(value)
    return made


@pytest.mark.parametrize("user", ROLES)
def test_every_role_reaches_every_key_the_contracts_name(acl_redis, admin, user):
    contract_keys = _every_contract_key()
    assert "tandem:processes" in contract_keys and "tandem:run:7:trajectories" in contract_keys
    if user == "tandem-trainer":
        # Environments' secrets are for the producers and probes that build environments.
        contract_keys = [key for key in contract_keys if not key.startswith("tandem:secrets:")]
    for key in contract_keys:
        for command in (("GET", key), ("SET", key, "1"), ("XADD", key, "*", "a", "b"), ("DEL", key)):
            assert admin.execute_command("ACL", "DRYRUN", user, *command) == b"OK", (user, command)


@pytest.mark.parametrize("user", ("tandem-worker", "tandem-trainer"))
def test_workers_and_the_trainer_cannot_touch_the_platforms_cache_or_channels(acl_redis, admin, user):
    client = _client(acl_redis, user)
    for key in ("tandem:cache:1:login-failures", "tandem:channels:group:run-7"):
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.set(key, "1")


def test_the_trainer_cannot_read_environment_secrets(acl_redis, admin):
    client = _client(acl_redis, "tandem-trainer")
    for key in ("tandem:secrets:run:7", "tandem:secrets:probe:3"):
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.get(key)
    assert admin.execute_command("ACL", "DRYRUN", "tandem-worker", "GET", "tandem:secrets:run:7") == b"OK"


def test_the_platform_users_channel_layer_sends_and_receives(acl_redis, admin):
    from channels_redis.core import RedisChannelLayer

    async def round_trip():
        layer = RedisChannelLayer(hosts=[{"address": _url(acl_redis, "tandem-platform")}],
                                  prefix="tandem:channels")
        channel = await layer.new_channel()
        await layer.group_add("run-7", channel)
        await layer.group_send("run-7", {"type": "run.update", "step": 3})
        message = await asyncio.wait_for(layer.receive(channel), timeout=10)
        await layer.close_pools()
        return message

    assert asyncio.run(round_trip())["step"] == 3
    assert admin.acl_log() == []


def test_a_rollout_worker_consumes_celery_tasks_under_its_user_with_no_denial(acl_redis, admin, tmp_path):
    # A real `tandem worker` as tandem-worker; the trainer and the platform enqueue as theirs.
    # Unknown task names: the worker receives, acknowledges and discards them, which is every
    # broker operation a task takes; the tasks' own keys are the contracts' (checked above).
    from celery import Celery

    from tandem.contracts import PROBE_QUEUE, ROLLOUT_QUEUE

    log = tmp_path / "worker.log"
    with log.open("w") as output:
        worker = subprocess.Popen(
            [sys.executable, "-m", "tandem.cli", "worker", "--name", "rollouts@acl-test",
             "--queues", f"{ROLLOUT_QUEUE},{PROBE_QUEUE}", "--concurrency", "1"],
            env={**os.environ, "REDIS_URL": _url(acl_redis, "tandem-worker")}, cwd=REPO_ROOT,
            stdout=output, stderr=subprocess.STDOUT)
    try:
        for user, queue in (("tandem-trainer", ROLLOUT_QUEUE), ("tandem-platform", PROBE_QUEUE)):
            sender = Celery(broker=_url(acl_redis, user))
            sender.send_task("tandem.test.acl_probe", args=[1], queue=queue)
            sender.close()
        def worker_runs() -> None:
            assert worker.poll() is None, f"the worker exited:\n{log.read_text()[-3000:]}"

        poll_until(lambda: not (admin.llen(ROLLOUT_QUEUE) or admin.llen(PROBE_QUEUE) or admin.hlen("unacked")),
                   timeout_s=120, interval_s=0.2, between=worker_runs,
                   what=lambda: f"the worker to consume the tasks:\n{log.read_text()[-3000:]}")
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(timeout=10)
    assert "acl_probe" in log.read_text()
    assert admin.acl_log() == [], admin.acl_log()
