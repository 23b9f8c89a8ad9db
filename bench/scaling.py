"""What more producers buy: trained samples/s with 1, 2, 4 and 8 producer processes, each on a host of its own.

Builds the multi-host stack of the end-to-end tests (tests/e2e/multi_host.py;
needs root and ``ip netns``): the platform, Redis and the example HTTP
environment server on host A, the trainer on host D, and one rollout worker on
each of up to eight producer hosts, which share no storage with the trainer and
reach everything over the network. The environment answers each step after
``--latency-ms`` (200 by default), as a remote environment does.

The same run config (the multi-turn guessing game, 6 environment steps an
episode, its policy held still so that every run does the same work) is
trained once per producer count, the counts in increasing order: before each
run, the workers of that count are started (the earlier ones stay), and each
run starts once the last run's producers are idle. Per count, over the RL steps
after the first: trained samples/s, the trainer's idle fraction (time-weighted
share of the steps spent waiting for trajectories), the producers' utilisation
(share of their time with a rollout task) and the fraction of the episodes made
that were dropped as too stale.

All of it shares this machine's cores: where the producers' inference and the
trainer's update together use every core, adding producers adds contention,
not capacity, and the knee reports that bound rather than the trainer's alone
(``config.cpu_count`` says how many cores there were).

Prints one JSON line keyed by producer count ("1", "2", "4", "8").

Each producer runs ``--task-threads`` tasks of one group of ``--group-size`` episodes at once (1 x 4
by default), few enough that one producer cannot keep the trainer busy.

Usage: ``python bench/scaling.py [--counts 1,2,4,8] [--rl-steps 8] [--latency-ms 200] [--task-threads 1]
[--group-size 4] [--groups-per-step 4]``
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
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.async_vs_sync import WORKLOADS, run_metrics, summarise, wait_for_idle_producers  # noqa: E402
from tandem.configs.changes import merge_changes  # noqa: E402
from tandem.configs.rollout import RolloutConfig  # noqa: E402
from tandem.contracts import TERMINAL_RUN_STATUSES  # noqa: E402
from tests.e2e.multi_host import multi_host_stack  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--counts", default="1,2,4,8", help="producer processes, one per host, increasing")
    parser.add_argument("--rl-steps", type=int, default=8)
    parser.add_argument("--latency-ms", type=float, default=200.0, help="the environment's step latency")
    parser.add_argument("--task-threads", type=int, default=1, help="rollout tasks each producer runs at once")
    parser.add_argument("--group-size", type=int, default=4, help="episodes of a group (one task makes one group)")
    parser.add_argument("--groups-per-step", type=int, default=4)
    args = parser.parse_args()
    counts = sorted(int(value) for value in args.counts.split(","))
    workload = WORKLOADS["multi-turn"]
    # A producer runs task_threads x group_size episodes at once: few enough that one producer cannot
    # keep the trainer busy, so that the counts show where more producers stop helping.
    rollout = RolloutConfig(group_size=args.group_size, groups_per_step=args.groups_per_step,
                            groups_per_task=1).model_dump()
    config = merge_changes({"sft_steps": 0, "rl_steps": args.rl_steps, "rollout": rollout,
                            "rl_learning_rate": 1e-9}, workload["config"])
    episodes_per_step = rollout["groups_per_step"] * rollout["group_size"]
    producer_hosts = [f"host-p{index + 1}" for index in range(counts[-1])]

    started = time.time()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="tandem-scaling-") as scratch, multi_host_stack(
            Path(scratch), producer_hosts=producer_hosts, worker_concurrency=args.task_threads,
            environment_latency_ms=args.latency_ms, environment=workload["server"]["environment"],
            environment_settings=workload["server"]["settings"], log_lines=0) as (stack, url):
        credentials = stack.prepare()
        stack.start_web()
        stack.start_platform_worker()
        stack.start_trainer(trainer_token=credentials.trainer_token)
        client = httpx.Client(base_url=stack.config.platform_url,
                              headers={"Authorization": f"Token {credentials.user_token}"}, timeout=30)
        client.post("/api/environments/", json={
            "project": credentials.project_id, "name": "guessing-game-on-host-a", "kind": "http",
            "settings": {"url": url, "timeout_s": 30}, "tools": httpx.get(f"{url}/schema").json()["tools"],
        }).raise_for_status()
        redis_client = redis.Redis.from_url(stack.config.redis_url)
        running = 0
        for count in counts:
            for index in range(running, count):
                stack.start_worker(index)  # on host-p{index + 1}
            running = count
            response = client.post("/api/runs/", json={
                "project": credentials.project_id, "name": f"{count} producers",
                "environment": "guessing-game-on-host-a", "config": config})
            response.raise_for_status()
            run_id = response.json()["id"]
            while (status := client.get(f"/api/runs/{run_id}/").json()["status"]) not in TERMINAL_RUN_STATUSES:
                stack.check_alive()
                time.sleep(1)
            summary = summarise(run_metrics(client, run_id), episodes_per_step)
            summary["status"] = status
            summary["producers_idle_after_s"] = wait_for_idle_producers(redis_client, run_id)
            results[str(count)] = summary

    output = {key: {name: summary.get(name) for name in ("samples_per_s", "trainer_idle_fraction",
                                                           "producer_utilisation", "stale_drop_fraction",
                                                           "status", "steps_measured", "step_s")}
              for key, summary in results.items()}
    base = results.get(str(counts[0]), {}).get("samples_per_s")
    for summary in output.values():
        summary["speedup_over_first"] = (round(summary["samples_per_s"] / base, 2)
                                         if base and summary["samples_per_s"] else None)
    output["config"] = {**config, "latency_ms": args.latency_ms, "task_threads_per_producer": args.task_threads,
                        "episodes_per_step": episodes_per_step, "cpu_count": os.cpu_count()}
    output["wall_s"] = round(time.time() - started, 1)
    print(json.dumps(output))


if __name__ == "__main__":
    main()
