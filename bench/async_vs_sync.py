"""The same run in both pipeline modes, against a remote environment of growing latency.

Starts a whole local Tandem (web, two rollout workers, trainer, Redis db 13
which it flushes) and one example HTTP environment server per latency
(``workers.environments.http_example_server``), then trains the same run
config with ``pipeline: async`` and ``pipeline: sync`` for each latency.
Throughput is trained samples per second of the RL steps after the first
(which pays for compilation); the trainer idle fraction is the share of
those steps spent waiting for trajectories. Prints one JSON line keyed by
latency in milliseconds.

Usage: ``python bench/async_vs_sync.py [--latencies 0,50,200,1000] [--rl-steps 6]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tandem.stack import LocalStack, StackConfig  # noqa: E402
from workers.environments import http_example_server  # noqa: E402


def run_metrics(client: httpx.Client, run_id: int) -> list[dict]:
    points, after = [], -1
    while True:
        page = client.get(f"/api/runs/{run_id}/metrics/", params={"after_step": after}).json()
        if not page["points"]:
            return points
        points += page["points"]
        after = page["next_after_step"]


def summarise(points: list[dict], episodes_per_step: int) -> dict:
    by_step: dict[int, dict[str, float]] = {}
    for point in points:
        by_step.setdefault(point["step"], {})[point["name"]] = point["value"]
    steps = [values for _, values in sorted(by_step.items()) if "samples_per_s" in values][1:]
    wall = sum(values["wall_s"] for values in steps)
    return {
        "samples_per_s": round(episodes_per_step * len(steps) / wall, 2) if wall else None,
        "trainer_idle_fraction": round(statistics.fmean(v["trainer_idle_fraction"] for v in steps), 3)
        if steps else None,
        "steps_measured": len(steps),
        "staleness_max": max((v.get("staleness_max", 0.0) for v in steps), default=None),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latencies", default="0,50,200,1000", help="environment step latencies, ms")
    parser.add_argument("--rl-steps", type=int, default=6)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    parser.add_argument("--port", type=int, default=8766)
    parser.add_argument("--workers", type=int, default=2, help="rollout worker processes")
    args = parser.parse_args()
    latencies = [int(value) for value in args.latencies.split(",")]

    config = {
        "sft_steps": 0, "rl_steps": args.rl_steps, "groups_per_step": 4, "group_size": 8,
        "groups_per_task": 1, "rollout_backlog_steps": 2, "max_staleness": 2, "max_turns": 2,
        "max_new_tokens": 16,
    }
    episodes_per_step = config["groups_per_step"] * config["group_size"]

    redis.Redis.from_url(args.redis_url).flushdb()
    var_dir = Path(tempfile.mkdtemp(prefix="tandem-bench-"))
    # Enough task threads for async's whole staleness budget of episodes in flight:
    # (max_staleness + 1) steps of groups, one group per task.
    task_threads = -(-(config["max_staleness"] + 1) * config["groups_per_step"] // args.workers)
    stack = LocalStack(StackConfig(redis_url=args.redis_url, port=args.port, var_dir=var_dir,
                                   workers=args.workers, worker_concurrency=task_threads,
                                   database_url=f"sqlite:///{var_dir / 'bench.sqlite3'}"))
    servers = []
    results: dict[str, dict] = {}
    started = time.time()
    try:
        credentials = stack.prepare()
        stack.start(credentials)
        client = httpx.Client(base_url=stack.config.platform_url,
                              headers={"Authorization": f"Token {credentials.user_token}"}, timeout=30)
        runs = []
        for latency in latencies:
            process, url = http_example_server.spawn(latency_ms=latency)
            servers.append(process)
            name = f"remote-calculator-{latency}ms"
            client.post("/api/environments/", json={
                "project": credentials.project_id, "name": name, "kind": "http",
                "settings": {"url": url, "timeout_s": 30},
                # The probe checks the declared tools against what the server exposes.
                "tools": httpx.get(f"{url}/schema").json()["tools"],
            }).raise_for_status()
            for pipeline in ("async", "sync"):
                response = client.post("/api/runs/", json={
                    "project": credentials.project_id, "name": f"{pipeline} {latency}ms",
                    "environment": name, "config": {**config, "pipeline": pipeline},
                })
                response.raise_for_status()
                runs.append((latency, pipeline, response.json()["id"]))
        for latency, pipeline, run_id in runs:
            while True:
                stack.check_alive()
                status = client.get(f"/api/runs/{run_id}/").json()["status"]
                if status in {"finished", "failed", "cancelled"}:
                    break
                time.sleep(1)
            summary = summarise(run_metrics(client, run_id), episodes_per_step)
            summary["status"] = status
            results.setdefault(str(latency), {})[pipeline] = summary
    finally:
        stack.stop()
        for process in servers:
            process.terminate()

    output = {}
    for latency, modes in results.items():
        async_, sync = modes.get("async", {}), modes.get("sync", {})
        speedup = (round(async_["samples_per_s"] / sync["samples_per_s"], 2)
                   if async_.get("samples_per_s") and sync.get("samples_per_s") else None)
        output[latency] = {
            "async_samples_per_s": async_.get("samples_per_s"),
            "sync_samples_per_s": sync.get("samples_per_s"),
            "speedup": speedup,
            "async_trainer_idle_fraction": async_.get("trainer_idle_fraction"),
            "sync_trainer_idle_fraction": sync.get("trainer_idle_fraction"),
            "async_staleness_max": async_.get("staleness_max"),
            "sync_staleness_max": sync.get("staleness_max"),
            "statuses": [async_.get("status"), sync.get("status")],
        }
    output["config"] = {**config, "workers": stack.config.workers,
                        "worker_concurrency": stack.config.worker_concurrency,
                        "episodes_per_step": episodes_per_step}
    output["wall_s"] = round(time.time() - started, 1)
    print(json.dumps(output))


if __name__ == "__main__":
    main()
