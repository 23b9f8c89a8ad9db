"""Health checks are answered while every rollout thread runs episodes: the stack's probe worker takes them."""

from __future__ import annotations

import socket

import pytest
import redis

from tandem.contracts import ProducerReport, producers_key
from tests.e2e.conftest import (
    example_http_environment,
    private_stack,
    register_http_environment,
    user_api,
)
from tests.polling import poll_until


@pytest.mark.timeout(1500)  # above its inner waits (tests/test_timeouts.py)
def test_a_probe_is_answered_while_the_only_rollout_worker_has_every_thread_on_episodes(tmp_path):
    # 3 s per step and tool call, up to 4 turns: a rollout task holds its thread for many seconds.
    with example_http_environment(latency_ms=3000) as url, private_stack(tmp_path, workers=1, log_lines=40) as stack:
        credentials = stack.prepare()
        stack.start(credentials)
        api = user_api(stack, credentials)
        register_http_environment(api, project_id=credentials.project_id, name="slow-remote", url=url)
        environment = api.get("/api/environments/", params={"name": "slow-remote"}).json()["results"][0]
        version_path = f"/api/environments/{environment['id']}/versions/1/"
        poll_until(lambda: api.get(version_path).json()["status"] == "ready", timeout_s=300,
                   between=stack.check_alive, what="the registration probe to pass")
        run = api.post("/api/runs/", json={
            "project": credentials.project_id, "name": "busy", "environment": "slow-remote",
            # Eight one-group tasks a step, more than the worker's four threads, for many steps.
            "config": {"sft_steps": 0, "rl_steps": 200,
                       "rollout": {"groups_per_step": 8, "group_size": 2, "groups_per_task": 1, "max_turns": 4}},
        })
        assert run.status_code == 201, run.text
        run_id = run.json()["id"]
        client = redis.Redis.from_url(stack.config.redis_url)
        rollout_worker = f"{socket.gethostname()}:{stack.processes['worker-0'].pid}"

        def running_tasks() -> int:
            raw = client.hget(producers_key(run_id), rollout_worker)
            return ProducerReport.model_validate_json(raw).running_tasks if raw else 0

        concurrency = stack.config.worker_concurrency
        poll_until(lambda: running_tasks() == concurrency, timeout_s=600, interval_s=0.2, between=stack.check_alive,
                   what=lambda: f"the rollout worker to run {concurrency} tasks at once (now {running_tasks()})")

        probe = api.post(f"{version_path}probe/").json()
        finished = poll_until(
            lambda: next((item for item in api.get(version_path).json()["probes"]
                          if item["id"] == probe["id"] and item["status"] != "pending"), None),
            timeout_s=300, between=stack.check_alive, what="the requested probe to finish")

        assert finished["status"] == "passed", finished
        # The probe worker answered it; the rollout worker was busy with episodes throughout.
        assert finished["worker"] == f"{socket.gethostname()}:{stack.processes['probe-worker'].pid}"
        assert api.get(f"/api/runs/{run_id}/").json()["status"] == "running"
        api.post(f"/api/runs/{run_id}/cancel/").raise_for_status()
        api.close()
        client.close()
