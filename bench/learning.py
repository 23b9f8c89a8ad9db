"""Does GRPO raise the calculator task's success rate after the SFT warm-up?

Runs the real pipeline (web, Celery producers, trainer, Redis) on the default
configuration and compares the success rate of the first RL steps (the SFT
policy, before GRPO changed it) with that of the last RL steps. Prints one
JSON line.

``--source`` picks where the SFT data comes from:

- ``builtin`` (default): the built-in calculator and its own demonstrations.
- ``http-dataset``: a learning proof without code. The calculator is served
  over HTTP by ``environments.http_example_server`` on its ``/faults/minimal``
  routes (no ``/demonstrations``). A JSONL file of demonstrations
  (``--write-dataset``) is uploaded as a dataset, and the run SFTs on it
  (``sft.datasets``). Everything goes through the REST API.

``success_gain_points`` is the rise from the first ``--window`` RL steps to the
last, in percentage points. ``run_wall_s`` runs from the run's creation to its end, and
``rl_wall_s`` covers its RL steps (the sum of their ``wall_s``).

Usage: ``python bench/learning.py [--source builtin|http-dataset] [--rl-steps N] [--config JSON]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from environments import http_example_server  # noqa: E402
from environments.builtin.calculator import CalculatorEnvironment  # noqa: E402
from tandem.cli.stack import LocalStack, StackConfig  # noqa: E402
from tandem.contracts import TERMINAL_RUN_STATUSES  # noqa: E402


def register_http_dataset_source(client: httpx.Client, project_id: int, url: str, *, rows: int) -> tuple[str, dict]:
    """The server at ``url`` as an environment without demonstrations, and a dataset of them uploaded.

    Returns the environment's name and the run config section that names the dataset.
    """
    url = f"{url}/faults/minimal"
    client.post("/api/environments/", json={
        "project": project_id, "name": "calculator-over-http", "kind": "http",
        "settings": {"url": url, "timeout_s": 30}, "tools": httpx.get(f"{url}/schema").json()["tools"],
    }).raise_for_status()
    return "calculator-over-http", upload_calculator_demonstrations(client, project_id, rows=rows)


def upload_calculator_demonstrations(client: httpx.Client, project_id: int, *, rows: int) -> dict:
    """``rows`` of the built-in calculator's demonstrations uploaded as the dataset ``calculator-demos``, once
    stored; the run config section that SFTs on it."""
    dataset = http_example_server.demonstrations_dataset(CalculatorEnvironment(), count=rows, seed=11)
    uploaded = client.post("/api/datasets/", data={"project": str(project_id), "name": "calculator-demos"},
                           files={"file": ("demos.jsonl", dataset.encode(), "application/jsonl")})
    uploaded.raise_for_status()
    # Accepted: the stack's datasets worker stores the rows; a run may pin the version once it is ready.
    version_path = f"/api/datasets/{uploaded.json()['id']}/versions/{uploaded.json()['latest_version']['number']}/"
    while (version := client.get(version_path).json())["status"] != "ready":
        if version["status"] == "failed":
            raise SystemExit(f"the dataset failed to be stored: {version['failure_reason']}")
        time.sleep(0.5)
    return {"sft": {"datasets": [{"name": "calculator-demos"}]}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--source", choices=("builtin", "http-dataset"), default="builtin")
    parser.add_argument("--rl-steps", type=int, default=40)
    parser.add_argument("--window", type=int, default=5, help="RL steps averaged at each end")
    parser.add_argument("--dataset-rows", type=int, default=2000, help="rows of the http-dataset source's dataset")
    parser.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13"))
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--config", default="{}", help="JSON overrides of the run config")
    args = parser.parse_args()

    import redis

    redis.Redis.from_url(args.redis_url).flushdb()
    var_dir = Path(tempfile.mkdtemp(prefix="tandem-bench-"))
    stack = LocalStack(StackConfig(redis_url=args.redis_url, port=args.port, var_dir=var_dir,
                                   database_url=f"sqlite:///{var_dir / 'bench.sqlite3'}"))
    credentials = stack.prepare()
    started = time.time()
    server = None
    try:
        stack.start(credentials)
        client = httpx.Client(base_url=stack.config.platform_url,
                              headers={"Authorization": f"Token {credentials.user_token}"}, timeout=30)
        environment, source_config = "calculator", {}
        if args.source == "http-dataset":
            server, url = http_example_server.spawn()
            environment, source_config = register_http_dataset_source(
                client, credentials.project_id, url, rows=args.dataset_rows)
        config = {"rl_steps": args.rl_steps, **source_config, **json.loads(args.config)}
        run = client.post("/api/runs/", json={"project": credentials.project_id, "name": "bench",
                                              "environment": environment, "config": config})
        run.raise_for_status()
        run_id = run.json()["id"]
        created_at = time.time()
        while True:
            stack.check_alive()
            status = client.get(f"/api/runs/{run_id}/").json()
            if status["status"] in TERMINAL_RUN_STATUSES:
                break
            time.sleep(2)
        run_wall_s = time.time() - created_at
        points, after = [], -1
        while True:
            page = client.get(f"/api/runs/{run_id}/metrics/", params={"after_step": after}).json()
            if not page["points"]:
                break
            points += page["points"]
            after = page["next_after_step"]
    finally:
        stack.stop()
        if server is not None:
            server.terminate()

    by_step: dict[int, dict[str, float]] = {}
    for point in points:
        by_step.setdefault(point["step"], {})[point["name"]] = point["value"]
    rl_steps = [values for _, values in sorted(by_step.items()) if "success_rate" in values]
    success = [values["success_rate"] for values in rl_steps]
    idle = [values["trainer_idle_fraction"] for values in rl_steps if "trainer_idle_fraction" in values]
    window = min(args.window, max(len(success) // 2, 1))
    before = sum(success[:window]) / window if success else None
    after_grpo = sum(success[-window:]) / window if success else None
    print(json.dumps({
        "source": args.source,
        "run_status": status["status"],
        "rl_steps": len(success),
        "success_rate_before_grpo": before,
        "success_rate_after_grpo": after_grpo,
        "success_gain_points": round(100 * (after_grpo - before), 1) if success else None,
        "success_rate_by_step": [round(s, 3) for s in success],
        "trainer_idle_fraction_rl_mean": sum(idle) / len(idle) if idle else None,
        "rl_wall_s": round(sum(values.get("wall_s", 0.0) for values in rl_steps), 1),
        "run_wall_s": round(run_wall_s, 1),
        "wall_s": round(time.time() - started, 1),
    }))


if __name__ == "__main__":
    main()
