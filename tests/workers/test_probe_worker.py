"""The probe through real processes: a rollout worker (`tandem worker`) runs it, the platform
worker (`tandem platform-worker`, with Celery beat) records it in PostgreSQL, over real Redis."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from django.db import connection

from accounts.services import project_create, user_create_with_token
from environment_registry.builtin import CALCULATOR, CALCULATOR_PRODUCTS
from environment_registry.models import EnvironmentVersion
from environment_registry.services import environment_register
from environments import http_example_server
from tandem.contracts import (
    PLATFORM_QUEUE,
    PROBE_QUEUE,
    EnvironmentSpec,
    ProbeBaselineRequest,
    environment_paused_key,
    probe_environment_secrets_key,
    probe_request_key,
)
from tests.processes import stop_processes, wait_for_celery_ready
from tests.workers.secret_environments import API_KEY

REPO_ROOT = Path(__file__).resolve().parents[2]
PROBE_TIMEOUTS = {"reset": 2.0, "step": 2.0, "close": 2.0}
HEALTH_INTERVAL_S = 2
# Bounds for a stuck process, not measures of speed: a worker imports JAX before it is ready, and the
# machine may be busy.
READY_TIMEOUT_S = 300
SETTLE_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def processes(django_db_setup, django_db_blocker, redis_url, tmp_path_factory):
    """One rollout worker on the probes queue and one platform worker with beat, on the test database."""
    database = connection.settings_dict
    password = f":{database['PASSWORD']}" if database.get("PASSWORD") else ""
    database_url = (f"postgres://{database['USER']}{password}@{database['HOST']}:{database['PORT']}/"
                    f"{database['NAME']}")
    client = redis.Redis.from_url(redis_url)
    client.delete(PROBE_QUEUE, PLATFORM_QUEUE)  # tasks left by an earlier session name rows long gone
    client.close()
    logs = tmp_path_factory.mktemp("probe-workers")
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "TANDEM_TEST_DATABASE_URL": database_url,  # config.settings.test reads it, not DATABASE_URL
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "platform")]),
        "TANDEM_HEALTH_CHECK_INTERVAL_S": str(HEALTH_INTERVAL_S),
        "TANDEM_PROBE_TIMEOUTS": '{"reset": 2.0, "step": 2.0, "close": 2.0}',
    }
    commands = {
        "worker": [sys.executable, "-m", "tandem.cli", "worker", "--queues", PROBE_QUEUE,
                   "--concurrency", "2", "--name", "probe-test@%h"],
        "platform": [sys.executable, "-m", "tandem.cli", "platform-worker",
                     "--schedule-file", str(logs / "celerybeat-schedule")],
    }
    started = {}
    for name, command in commands.items():
        log = open(logs / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        started[name] = (subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log,
                                          stderr=subprocess.STDOUT), log)
    try:
        # Both ready before any test's own wait starts: on a busy machine (another pytest process starting
        # a stack) starting them took over two minutes of a test's SETTLE_TIMEOUT_S in CI.
        for name, (process, _) in started.items():
            wait_for_celery_ready(process, logs / f"{name}.log", timeout_s=READY_TIMEOUT_S)
        yield logs
    finally:
        stop_processes([process for process, _ in started.values()], grace_s=20)
        for _, log in started.values():
            log.close()


@pytest.fixture
def owner_project(transactional_db):
    user, _ = user_create_with_token(username="prober", password="pw")
    return user, project_create(owner=user, name="probes")


@pytest.fixture
def settings_for_probes(settings):
    settings.TANDEM_PROBE_TIMEOUTS = PROBE_TIMEOUTS


@pytest.fixture
def example_server():
    process, url = http_example_server.spawn()
    yield process, url
    process.kill()
    process.wait()


def _wait_for(predicate, *, logs: Path, what: str, timeout_s: float = SETTLE_TIMEOUT_S):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    tails = {path.name: path.read_text(errors="replace")[-3000:] for path in logs.glob("*.log")}
    pytest.fail(f"{what} did not happen within {timeout_s}s; logs: {tails}")


def _settled(version_id: int) -> EnvironmentVersion | None:
    version = EnvironmentVersion.objects.get(pk=version_id)
    return version if version.status != EnvironmentVersion.Status.PENDING else None


def test_a_worker_probes_good_broken_and_hanging_environments(
    processes, owner_project, settings_for_probes, example_server
):
    user, project = owner_project
    _, url = example_server
    specs = {
        "good": CALCULATOR,
        "good-http": EnvironmentSpec(name="good-http", kind="http", settings={"url": url},
                                     tools=CALCULATOR.tools),
        "broken": EnvironmentSpec(name="broken", kind="python",
                                  entrypoint="tests.workers.probe_environments:BrokenStepEnvironment"),
        "hanging": EnvironmentSpec(name="hanging", kind="http", settings={"url": f"{url}/faults/hang"},
                                   tools=CALCULATOR.tools),
    }
    registered_at = time.monotonic()
    versions = {
        name: environment_register(user=user, project=project,
                                   spec=spec.model_copy(update={"name": name}))
        for name, spec in specs.items()
    }

    good = _wait_for(lambda: _settled(versions["good"].pk), logs=processes, what="the good probe")
    print(f"built-in calculator ready {time.monotonic() - registered_at:.1f}s after registration")
    settled = {name: _wait_for(lambda v=version: _settled(v.pk), logs=processes, what=f"{name}'s probe")
               for name, version in versions.items()}

    assert good.status == "ready", good.status_reason
    assert settled["good-http"].status == "ready", settled["good-http"].status_reason
    probe = good.probes.get(purpose="registration")
    assert probe.status == "passed" and probe.worker.endswith(tuple("0123456789"))
    assert [check["name"] for check in probe.checks] == [
        "url", "load", "sample_task", "reset", "tools", "step", "budget", "demonstrations", "close"]
    assert all(check["latency_s"] < 2.0 for check in probe.checks)

    broken = settled["broken"]
    assert broken.status == "failed"
    assert "step: ValueError: invalid literal for int()" in broken.status_reason
    hanging = settled["hanging"]
    assert hanging.status == "failed"
    assert "reset: timed out after 2s" in hanging.status_reason
    reset = next(check for check in hanging.probes.get(purpose="registration").checks if check["name"] == "reset")
    assert reset["timeout_s"] == 2.0 and 2.0 <= reset["latency_s"] < 3.5


def test_beat_health_checks_pause_an_environment_whose_server_died(
    processes, owner_project, settings_for_probes, example_server, redis_client
):
    user, project = owner_project
    server, url = example_server
    spec = EnvironmentSpec(name="remote", kind="http", settings={"url": url, "retries": 0},
                           tools=CALCULATOR.tools)
    version = environment_register(user=user, project=project, spec=spec)
    ready = _wait_for(lambda: _settled(version.pk), logs=processes, what="the registration probe")
    assert ready.status == "ready", ready.status_reason

    server.kill()
    server.wait()
    unhealthy = _wait_for(
        lambda: EnvironmentVersion.objects.filter(pk=version.pk, status="unhealthy").first(),
        logs=processes, what="a failed health check", timeout_s=60,
    )

    assert unhealthy.status_reason.startswith("Health check probe")
    assert "reset: RemoteEnvironmentError" in unhealthy.status_reason
    flag = _wait_for(lambda: redis_client.get(environment_paused_key(version.pk)),
                     logs=processes, what="the pause flag", timeout_s=10)
    assert b"reset: RemoteEnvironmentError" in flag
    redis_client.delete(environment_paused_key(version.pk))


def test_a_worker_probes_an_environment_with_its_secret_settings(processes, owner_project, settings_for_probes,
                                                                 redis_client):
    user, project = owner_project
    spec = EnvironmentSpec(name="keyed", kind="python",
                           entrypoint="tests.workers.secret_environments:KeyedEnvironment")
    version = environment_register(user=user, project=project, spec=spec, secret_settings={"api_key": API_KEY})

    ready = _wait_for(lambda: _settled(version.pk), logs=processes, what="the probe of a keyed environment")

    # KeyedEnvironment cannot be built without its key and rewards 1 only with the right one.
    assert ready.status == "ready", ready.status_reason
    step = next(check for check in ready.probes.get().checks if check["name"] == "step")
    assert step["message"] == "reward 1, done True"
    # Recording the report deleted the probe's secrets; its request never held them.
    probe_id = ready.probes.get().pk
    assert redis_client.get(probe_environment_secrets_key(probe_id)) is None
    assert API_KEY.encode() not in (redis_client.get(probe_request_key(probe_id)) or b"")
    logs = "".join(path.read_text(errors="replace") for path in processes.glob("*.log"))
    assert API_KEY not in logs


# Loading the model and compiling its engine in the worker, then four short episodes: a bound for a stuck
# worker on a busy machine, not a measure of speed.
BASELINE_SETTLE_S = 480


def test_a_worker_plays_the_imported_models_baseline_and_the_platform_keeps_it(
    processes, owner_project, settings_for_probes, smollm2
):
    user, project = owner_project
    baseline = ProbeBaselineRequest(model=str(smollm2), episodes=4, max_new_tokens=48, max_turns=2, max_seq_len=512)
    version = environment_register(user=user, project=project, spec=CALCULATOR_PRODUCTS, baseline=baseline)

    ready = _wait_for(lambda: _settled(version.pk), logs=processes, what="the probe with a baseline",
                      timeout_s=BASELINE_SETTLE_S)

    # The model never calls its tool: the registration says so, and the environment is ready all the same.
    assert ready.status == "ready", ready.status_reason
    probe = ready.probes.get(purpose="registration")
    assert probe.baseline_request == baseline.model_dump(mode="json")
    assert probe.baseline["model"] == str(smollm2) and probe.baseline["episodes"] == 4
    assert probe.baseline["tool_use"]["tool_call_rate"] == 0.0
    assert probe.baseline["statuses"].get("failed", 0) == 0, probe.baseline
    check = probe.checks[-1]
    assert check["name"] == "baseline" and check["status"] == "warning"
    assert "never called a tool" in check["message"]
