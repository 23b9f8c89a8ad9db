"""A rollout worker SIGKILLed mid-episode: its episodes are counted lost and the run goes on."""

from __future__ import annotations

import os
import signal
import time

import pytest

from tandem.contracts import ROLLOUTS
from tests.e2e.conftest import (
    example_http_environment,
    private_stack,
    register_http_environment,
    user_api,
)
from tests.polling import poll_until


@pytest.fixture
def slow_environment_url():
    """The example HTTP environment with 2 s per step, so episodes are in flight when a worker dies."""
    with example_http_environment(latency_ms=2000) as url:
        yield url


@pytest.fixture
def own_stack(tmp_path):
    """A stack of its own (Redis db 12): killing its worker disturbs no other test."""
    with private_stack(tmp_path) as stack:
        yield stack


@pytest.mark.timeout(1800)  # above its inner waits (tests/test_timeouts.py)
def test_a_killed_producer_loses_only_its_in_flight_episodes(own_stack, slow_environment_url):
    stack = own_stack
    credentials = stack.prepare()
    stack.start(credentials)
    api = user_api(stack, credentials)
    register_http_environment(api, project_id=credentials.project_id, name="slow-remote", url=slow_environment_url)
    run = api.post("/api/runs/", json={
        "project": credentials.project_id, "name": "producer death", "environment": "slow-remote",
        # 100 steps of 2 s episodes last well past rollout.timeout_s (about 110 s on a quiet machine),
        # so the killed worker's groups expire, and are counted, before the run ends.
        "config": {"sft_steps": 0, "rl_steps": 100, "rollout": {
            "groups_per_step": 2, "group_size": 2, "groups_per_task": 1, "max_turns": 1,
            # Long enough that a live but slow producer's groups never count as lost, even with
            # two suites side by side on the machine; only the killed worker's do.
            "timeout_s": 60}},
    })
    assert run.status_code == 201, run.text
    run_id = run.json()["id"]

    # Kill the first worker as soon as it holds a rollout task.
    victim = stack.processes["worker-0"]
    log = stack.log_dir / "worker-0.log"
    poll_until(lambda: f"Task {ROLLOUTS.name}" in log.read_text(errors="replace"), timeout_s=600,
               interval_s=0.2, what="worker-0 to receive a rollout task")
    time.sleep(1.0)  # its episodes are now waiting on the 2 s environment step
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(timeout=10)
    # It ran no rollout task to the end (an environment probe may have succeeded there).
    assert not [line for line in log.read_text(errors="replace").splitlines()
                if ROLLOUTS.name in line and "succeeded" in line]

    def trainer_alive():
        assert stack.processes["trainer"].poll() is None, "the trainer died"

    status = poll_until(
        lambda: (status := api.get(f"/api/runs/{run_id}/").json()["status"]) in {"finished", "failed"} and status,
        timeout_s=900, interval_s=1.0, between=trainer_alive, what="the run to end after its producer died")
    assert status == "finished"

    points = api.get(f"/api/runs/{run_id}/metrics/", params={"after_step": -1, "names": "episodes_lost"})
    lost = sum(point["value"] for point in points.json()["points"])
    # Exactly the episodes of the tasks worker-0 held when it died (a group of 2 each) were lost.
    held = log.read_text(errors="replace").count(f"Task {ROLLOUTS.name}")
    assert lost == 2 * held, (lost, held)
