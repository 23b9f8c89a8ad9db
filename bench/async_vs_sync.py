"""The same run in both pipeline modes, against a remote environment of growing latency.

Starts a whole local Tandem (web, two rollout workers, trainer, Redis db 13
which it flushes) and one example HTTP environment server per latency
(``environments.http_example_server``), then trains the same run
config with ``rollout.pipeline: async`` and ``sync`` for each latency,
``--repeats`` times, async and sync runs interleaved so that drift in a shared
machine's speed falls on both. Runs go one at a time, each once the previous
run's producers are idle (an async run leaves episodes in flight when it
ends). Throughput is trained samples per second of the RL steps after the
first (which pays for compilation and warm-up); the trainer idle
fraction is the share of those steps spent waiting for trajectories. Each
latency reports the median over repeats, and every repeat's figures.

``--capacity-updates K`` adds a row keyed ``"capacity"``: the 200 ms run with
K optimizer updates per batch (``algorithm.updates_per_batch``), so that the
trainer, not generation, is the bottleneck and producers have capacity to
spare (their utilisation, the share of time they had a rollout task, stays
below 1). That is the condition under which an asynchronous trainer should
almost never wait.

``--workload`` picks what an episode is (the policy is a fresh, untrained
nano model and barely learns, so both modes run the same workload):

- ``multi-turn`` (default): the guessing game served over HTTP, where a
  malformed guess costs a guess and gets a format hint
  (``retry_malformed``), so every episode takes its 6 turns: 6 environment
  steps that each wait the latency, as a tool-using agent's would.
- ``single-turn``: the calculator served over HTTP; the untrained policy
  never calls its tool, so an episode is one reset and one step that waits
  the latency.

Prints one JSON line keyed by latency in milliseconds.

Usage: ``python bench/async_vs_sync.py [--latencies 0,50,200,1000] [--rl-steps 6] [--repeats 3]
[--capacity-updates 16] [--workload multi-turn|single-turn]``
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

from environments import http_example_server  # noqa: E402
from tandem.cli.stack import LocalStack, StackConfig  # noqa: E402
from tandem.configs.changes import merge_changes  # noqa: E402
from tandem.configs.rollout import RolloutConfig  # noqa: E402
from tandem.contracts import TERMINAL_RUN_STATUSES, ProducerReport, producers_key  # noqa: E402


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
    rl_steps = [values for _, values in sorted(by_step.items()) if "samples_per_s" in values]
    steps = rl_steps[1:]
    wall = sum(values["wall_s"] for values in steps)
    # Over every RL step (the first too): episodes dropped as stale over episodes generated,
    # those trained plus those dropped.
    dropped = sum(values.get("staleness/trajectories_dropped", 0.0) for values in rl_steps)
    generated = dropped + episodes_per_step * len(rl_steps)

    def mean_of(name: str) -> float | None:
        values = [v[name] for v in steps if name in v]
        return round(statistics.fmean(values), 3) if values else None

    return {
        "samples_per_s": round(episodes_per_step * len(steps) / wall, 2) if wall else None,
        # Time-weighted: the share of the measured wall time spent waiting.
        "trainer_idle_fraction": round(sum(v["wait_s"] for v in steps) / wall, 3) if wall else None,
        "producer_utilisation": mean_of("producers/utilisation"),
        "samples_produced_per_s": mean_of("samples_produced_per_s"),
        "idle_fraction_by_step": [round(v["trainer_idle_fraction"], 3) for v in steps],
        "steps_measured": len(steps),
        # Where a measured step's wall time goes (seconds, means): waiting, the update, publishing.
        "step_s": {name: mean_of(name) for name in ("wall_s", "wait_s", "compute_s", "publish_s", "other_s")},
        "staleness_max": max((v.get("staleness_max", 0.0) for v in steps), default=None),
        "stale_drop_fraction": round(dropped / generated, 3) if generated else None,
    }


def wait_for_idle_producers(client: redis.Redis, run_id: int, timeout_s: float = 120.0) -> float:
    """Seconds until no producer runs a task of the finished ``run_id`` any more.

    A run's last steps leave episodes in flight (async asks ahead); the next run
    must not share the cores with them, or its first steps would be measured slower.
    """
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        reports = [ProducerReport.model_validate_json(raw)
                   for raw in client.hgetall(producers_key(run_id)).values()]
        if all(report.running_tasks == 0 for report in reports):
            break
        time.sleep(0.5)
    return round(time.monotonic() - started, 1)


def median_of(summaries: list[dict], name: str) -> float | None:
    values = [summary[name] for summary in summaries if summary.get(name) is not None]
    return round(statistics.median(values), 3) if values else None


# What each workload's environment server serves, and the run settings it needs.
WORKLOADS = {
    "multi-turn": {
        "server": {"environment": "environments.builtin.guessing_game:GuessingGameEnvironment",
                   "settings": {"max_guesses": 6, "retry_malformed": True}},
        # 6 turns of up to 8 tokens and their hints fit in 256 tokens.
        "config": {"rollout": {"max_turns": 6}, "sampling": {"max_new_tokens": 8}, "model": {"max_seq_len": 256}},
    },
    "single-turn": {
        "server": {},
        "config": {"rollout": {"max_turns": 2}, "sampling": {"max_new_tokens": 16}},
    },
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latencies", default="0,50,200,1000", help="environment step latencies, ms")
    parser.add_argument("--rl-steps", type=int, default=6)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    parser.add_argument("--port", type=int, default=8766)
    parser.add_argument("--workers", type=int, default=2, help="rollout worker processes")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each mode per latency")
    parser.add_argument("--max-staleness", type=int, default=None,
                        help="the run's rollout.max_staleness and backlog_steps (default: the run config's "
                             "defaults): async keeps this many steps + 1 of episodes requested, in flight or "
                             "finished and waiting for their step, so with latency-bound episodes its gain over "
                             "sync is at most about this + 1")
    parser.add_argument("--capacity-updates", type=int, default=0,
                        help="updates per batch of the trainer-bound 200 ms row; 0: no such row")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="multi-turn")
    args = parser.parse_args()
    latencies = [int(value) for value in args.latencies.split(",")]
    workload = WORKLOADS[args.workload]

    # The default config's rollout section, unless --max-staleness sets the bound and the backlog.
    rollout = RolloutConfig().model_dump()
    if args.max_staleness is not None:
        rollout.update(backlog_steps=args.max_staleness, max_staleness=args.max_staleness)
    config = merge_changes({
        "sft_steps": 0, "rl_steps": args.rl_steps, "rollout": rollout,
        # The policy barely moves, so both modes run the same workload: a learning policy changes how
        # many turns and tool calls its episodes take, and a run that learned faster would look faster.
        "rl_learning_rate": 1e-9,
    }, workload["config"])
    episodes_per_step = rollout["groups_per_step"] * rollout["group_size"]

    redis.Redis.from_url(args.redis_url).flushdb()
    var_dir = Path(tempfile.mkdtemp(prefix="tandem-bench-"))
    # Enough task threads for async's whole staleness budget of episodes in flight:
    # (max_staleness + 1) steps of groups, groups_per_task groups per task.
    tasks_in_flight = -(-(rollout["max_staleness"] + 1) * rollout["groups_per_step"] // rollout["groups_per_task"])
    task_threads = -(-tasks_in_flight // args.workers)
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
        scenarios = [(str(latency), latency, {}) for latency in latencies]
        if args.capacity_updates:
            scenarios.append(("capacity", 200, {"algorithm": {"updates_per_batch": args.capacity_updates}}))
        environments: dict[int, str] = {}
        redis_client = redis.Redis.from_url(args.redis_url)
        for repeat in range(args.repeats):
            for key, latency, overrides in scenarios:
                if latency not in environments:
                    process, url = http_example_server.spawn(latency_ms=latency, **workload["server"])
                    servers.append(process)
                    environments[latency] = f"remote-{args.workload}-{latency}ms"
                    client.post("/api/environments/", json={
                        "project": credentials.project_id, "name": environments[latency], "kind": "http",
                        "settings": {"url": url, "timeout_s": 30},
                        # The probe checks the declared tools against what the server exposes.
                        "tools": httpx.get(f"{url}/schema").json()["tools"],
                    }).raise_for_status()
                # Alternate which mode goes first, so neither always runs on a warmer machine.
                modes = ("async", "sync") if repeat % 2 == 0 else ("sync", "async")
                for pipeline in modes:
                    response = client.post("/api/runs/", json={
                        "project": credentials.project_id, "name": f"{pipeline} {key} #{repeat}",
                        "environment": environments[latency],
                        "config": merge_changes(config, {**overrides, "rollout": {"pipeline": pipeline}}),
                    })
                    response.raise_for_status()
                    run_id = response.json()["id"]
                    while True:
                        stack.check_alive()
                        status = client.get(f"/api/runs/{run_id}/").json()["status"]
                        if status in TERMINAL_RUN_STATUSES:
                            break
                        time.sleep(1)
                    summary = summarise(run_metrics(client, run_id), episodes_per_step)
                    summary["status"] = status
                    summary["producers_idle_after_s"] = wait_for_idle_producers(redis_client, run_id)
                    results.setdefault(key, {}).setdefault(pipeline, []).append(summary)
    finally:
        stack.stop()
        for process in servers:
            process.terminate()

    output = {}
    for key, modes in results.items():
        async_runs, sync_runs = modes.get("async", []), modes.get("sync", [])
        # Each repeat's async run against the sync run of the same repeat.
        ratios = [round(a["samples_per_s"] / s["samples_per_s"], 2)
                  for a, s in zip(async_runs, sync_runs, strict=False)
                  if a.get("samples_per_s") and s.get("samples_per_s")]
        output[key] = {
            "async_samples_per_s": median_of(async_runs, "samples_per_s"),
            "sync_samples_per_s": median_of(sync_runs, "samples_per_s"),
            "speedup": round(statistics.median(ratios), 2) if ratios else None,
            "speedups": ratios,
            "async_trainer_idle_fraction": median_of(async_runs, "trainer_idle_fraction"),
            "sync_trainer_idle_fraction": median_of(sync_runs, "trainer_idle_fraction"),
            "async_producer_utilisation": median_of(async_runs, "producer_utilisation"),
            "sync_producer_utilisation": median_of(sync_runs, "producer_utilisation"),
            "async_stale_drop_fraction": median_of(async_runs, "stale_drop_fraction"),
            "sync_stale_drop_fraction": median_of(sync_runs, "stale_drop_fraction"),
            "async_staleness_max": max((r["staleness_max"] for r in async_runs if r.get("staleness_max") is not None),
                                       default=None),
            "statuses": sorted({r["status"] for r in async_runs + sync_runs}),
            "repeats": {"async": async_runs, "sync": sync_runs},
        }
    output["config"] = {**config, "workload": args.workload, "workers": stack.config.workers, "repeats": args.repeats,
                        "capacity_updates_per_batch": args.capacity_updates,
                        "worker_concurrency": stack.config.worker_concurrency,
                        "episodes_per_step": episodes_per_step}
    output["wall_s"] = round(time.time() - started, 1)
    print(json.dumps(output))


if __name__ == "__main__":
    main()
