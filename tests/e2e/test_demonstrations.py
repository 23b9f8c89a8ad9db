"""SFT demonstrations in a whole run: producers make them, the trainer never imports the environment.

The stack's trainer process has the same TANDEM_ENVIRONMENT_MODULES as its workers, so it could
import the run's environment; these runs prove it asks the rollout workers instead.
"""

from __future__ import annotations

import redis

from tests.e2e.conftest import run_ended, user_api
from tests.e2e.demonstration_environments import IMPORTERS_KEY
from tests.polling import poll_until

SFT_STEPS = 6
SFT_ONLY = {"algorithm": {"name": "sft"}, "sft_steps": SFT_STEPS, "sft_batch_size": 4, "rl_steps": 0,
            "checkpoint": {"every": 3}}


def _register_and_run(api, credentials, *, name: str, entrypoint: str) -> int:
    registered = api.post("/api/environments/", json={
        "project": credentials.project_id, "name": name, "kind": "python", "entrypoint": entrypoint,
    })
    registered.raise_for_status()
    # A class of the user's own demonstrates as its probe found: SFT without a dataset waits for it.
    poll_until(lambda: api.get(f"/api/environments/{registered.json()['id']}/").json()["latest_version"]["status"]
               != "pending", timeout_s=60, interval_s=0.5, what="the environment's probe to report")
    created = api.post("/api/runs/", json={
        "project": credentials.project_id, "name": name, "environment": name, "config": SFT_ONLY,
    })
    assert created.status_code == 201, created.text
    return created.json()["id"]


def _wait_until_ended(local, api, run_id: int) -> dict:
    return run_ended(local, api, run_id, timeout_s=300)


def test_trainer_never_imports_the_environment_for_demonstrations(stack, credentials):
    local, _ = stack
    api = user_api(local, credentials)
    client = redis.Redis.from_url(local.config.redis_url)
    client.delete(IMPORTERS_KEY)

    run_id = _register_and_run(api, credentials, name="echo-demonstrations",
                               entrypoint="tests.e2e.demonstration_environments:EchoEnvironment")
    run = _wait_until_ended(local, api, run_id)

    assert run["status"] == "finished", run["status_reason"]
    # Every SFT step trained on demonstrations, so they were made somewhere ...
    points = api.get(f"/api/runs/{run_id}/metrics/", params={"after_step": -1, "names": "loss"}).json()["points"]
    assert sorted(point["step"] for point in points) == list(range(1, SFT_STEPS + 1))
    # ... and never in the trainer: only producers (probe and demonstrations) imported the module.
    importers = {int(pid) for pid in client.lrange(IMPORTERS_KEY, 0, -1)}
    # The producers: the rollout workers and the probe worker, which probed the environment.
    producer_pids = {process.pid for name, process in local.processes.items()
                     if name.startswith("worker-") or name == "probe-worker"}
    assert importers and importers <= producer_pids, (importers, producer_pids)
    assert local.processes["trainer"].pid not in importers
    client.close()


def test_demonstrations_that_raise_fail_the_run_with_their_reason(stack, credentials):
    local, _ = stack
    api = user_api(local, credentials)

    run_id = _register_and_run(api, credentials, name="broken-demonstrator",
                               entrypoint="tests.e2e.demonstration_environments:BrokenDemonstratorEnvironment")
    run = _wait_until_ended(local, api, run_id)

    assert run["status"] == "failed"
    assert "the demonstrations of SFT step 1 failed" in run["status_reason"], run["status_reason"]
    assert ("environment broken-demonstrator@1: demonstrations() raised RuntimeError: "
            "the demonstrator is broken") in run["status_reason"]
    local.check_alive()  # the trainer and the producers live on for the next run
