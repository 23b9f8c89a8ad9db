"""Every process of a real Tandem reports itself: web, platform worker and its beat, rollout workers, trainer.

A stack of its own (Redis db 7) with a 1 s report interval, and a run on a slow
environment, so that the trainer and a rollout worker are seen working on it.
"""

from __future__ import annotations

import time

import pytest
import redis

from tandem.contracts import process_reports_key
from tandem.runtime.process_reports import live_process_reports
from tests.e2e.conftest import (
    example_http_environment,
    private_stack,
    register_http_environment,
    user_api,
)
from tests.polling import poll_until

INTERVAL_S = 1.0


@pytest.fixture
def slow_environment_url():
    """The example HTTP environment with 1 s per step, so rollout tasks are running while the test looks."""
    with example_http_environment(latency_ms=1000) as url:
        yield url


@pytest.fixture
def own_stack(tmp_path):
    with private_stack(tmp_path, log_lines=30,
                       extra_env={"TANDEM_PROCESS_REPORT_INTERVAL_S": str(INTERVAL_S)}) as stack:
        yield stack


@pytest.mark.timeout(1200)  # above its inner waits (tests/test_timeouts.py)
def test_every_tandem_process_reports_itself_and_the_run_it_works_on(own_stack, slow_environment_url):
    stack = own_stack
    credentials = stack.prepare()
    stack.start(credentials)
    api = user_api(stack, credentials)
    register_http_environment(api, project_id=credentials.project_id, name="slow-remote", url=slow_environment_url)
    run = api.post("/api/runs/", json={
        "project": credentials.project_id, "name": "watched", "environment": "slow-remote",
        "config": {"sft_steps": 0, "rl_steps": 50,
                   "rollout": {"groups_per_step": 2, "group_size": 2, "groups_per_task": 1, "max_turns": 2}},
    })
    assert run.status_code == 201, run.text
    run_id = run.json()["id"]
    pids = {name: process.pid for name, process in stack.processes.items()}
    expected = {(pids["web"], "web"), (pids["platform-worker"], "platform_worker"),
                (pids["worker-0"], "rollout_worker"), (pids["worker-1"], "rollout_worker"),
                (pids["trainer"], "trainer")}

    seen_working: dict[str, bool] = {"trainer": False, "rollout_worker": False}
    seen: dict[str, object] = {}

    def every_process_reported_and_both_seen_working():
        processes = api.get("/api/processes/").json()["processes"]
        seen["reported"] = {(process["pid"], process["role"]) for process in processes}
        for process in processes:
            if run_id in [entry["run"] for entry in process["runs"]] and process["role"] in seen_working:
                seen_working[process["role"]] = True
        beat = [process for process in processes if process["name"] == "celery beat"]
        return (processes, beat) if expected <= seen["reported"] and beat and all(seen_working.values()) else None

    processes, beat = poll_until(
        every_process_reported_and_both_seen_working, timeout_s=600, interval_s=0.5, between=stack.check_alive,
        what=lambda: f"every process's report and the run at work: {seen.get('reported')}, {expected}, {seen_working}")

    by_pid = {process["pid"]: process for process in processes}
    assert by_pid[pids["worker-0"]]["name"].startswith("rollouts-0@")
    assert by_pid[pids["platform-worker"]]["name"].startswith("platform@")
    (beat,) = beat
    assert beat["role"] == "platform_worker" and beat["pid"] not in pids.values()  # a child of the platform worker
    for process in processes:
        assert process["interval_s"] == INTERVAL_S
        assert process["rss_bytes"] > 20 * 2**20 and 0 <= process["cpu_cores"] <= process["host_cpu_count"]
    api.post(f"/api/runs/{run_id}/cancel/").raise_for_status()
    api.close()

    # A worker's warm shutdown finishes the rollout task it holds (steps of 1 s each): on a loaded
    # machine that outlasts the default grace, and a killed process could not delete its report.
    stack.stop(timeout_s=300)
    # Stopped cleanly, each process deleted its own report; beat, stopped with its parent, is pruned once stale.
    client = redis.Redis.from_url(stack.config.redis_url)
    try:
        left = {int(field.decode().rsplit(":", 1)[1]) for field in client.hkeys(process_reports_key())}
        assert left <= {beat["pid"]}, left
        time.sleep(3 * INTERVAL_S + 0.5)
        assert live_process_reports(client) == []
        assert client.hlen(process_reports_key()) == 0
    finally:
        client.close()
