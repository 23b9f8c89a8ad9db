"""What held-out evaluation during training costs the trainer, and how long an evaluation takes.

Starts a whole local Tandem (web, two rollout workers, trainer, Redis db 13
which it flushes) and trains the same calculator run with evaluation every
``--every`` RL steps and without any, ``--repeats`` times, alternating which
goes first. The trainer's samples/s is over the RL steps after the first
(which pays for compilation). Evaluation episodes run on the same producers,
so on a machine whose cores the trainer shares with them (like a 2-core
laptop), the slowdown is mostly their CPU. ``eval_256_episodes_s`` is the
median wall time of the evaluations of a run with 64 tasks x 4 samples, from
the trainer's request to its last episode (``metrics.wall_s``).

Prints one JSON line: ``samples_per_s_with_eval``, ``samples_per_s_without_eval``,
``slowdown`` (1 minus their ratio, median over repeats), ``eval_256_episodes_s``.

Usage: ``python bench/evaluation.py [--rl-steps 20] [--every 5] [--repeats 1]``
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

from tandem.cli.stack import LocalStack, StackConfig  # noqa: E402
from tandem.contracts import TERMINAL_RUN_STATUSES  # noqa: E402


def run_to_end(client: httpx.Client, stack: LocalStack, project: int, name: str, config: dict) -> int:
    response = client.post("/api/runs/", json={"project": project, "name": name, "environment": "calculator",
                                               "config": config})
    response.raise_for_status()
    run_id = response.json()["id"]
    while client.get(f"/api/runs/{run_id}/").json()["status"] not in TERMINAL_RUN_STATUSES:
        stack.check_alive()
        time.sleep(1)
    return run_id


def samples_per_s(client: httpx.Client, run_id: int) -> float:
    points = client.get(f"/api/runs/{run_id}/metrics/",
                        params={"after_step": -1, "names": "samples_per_s,wall_s"}).json()["points"]
    by_step: dict[int, dict[str, float]] = {}
    for point in points:
        by_step.setdefault(point["step"], {})[point["name"]] = point["value"]
    rl_steps = [values for _, values in sorted(by_step.items()) if "samples_per_s" in values][1:]
    wall = sum(values["wall_s"] for values in rl_steps)
    return sum(values["samples_per_s"] * values["wall_s"] for values in rl_steps) / wall


def evaluation_seconds(client: httpx.Client, run_id: int) -> list[float]:
    body = client.get(f"/api/runs/{run_id}/evaluations/").json()
    rows = body["results"] if isinstance(body, dict) else body
    return [row["metrics"]["wall_s"] for row in rows if row["status"] == "complete"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rl-steps", type=int, default=20)
    parser.add_argument("--every", type=int, default=5, help="evaluation.every_steps of the evaluated runs")
    parser.add_argument("--tasks", type=int, default=32, help="evaluation.tasks of the slowdown runs")
    parser.add_argument("--samples", type=int, default=4, help="evaluation.samples_per_task")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    parser.add_argument("--port", type=int, default=8767)
    args = parser.parse_args()

    redis.Redis.from_url(args.redis_url).flushdb()
    var_dir = Path(tempfile.mkdtemp(prefix="tandem-bench-"))
    stack = LocalStack(StackConfig(redis_url=args.redis_url, port=args.port, var_dir=var_dir,
                                   database_url=f"sqlite:///{var_dir / 'bench.sqlite3'}"))
    # A short SFT phase: the bench is about the RL steps.
    base = {"sft_steps": 20, "rl_steps": args.rl_steps}
    evaluated = {**base, "evaluation": {"every_steps": args.every, "tasks": args.tasks,
                                        "samples_per_task": args.samples, "pass_k": [1, args.samples]}}
    started = time.time()
    with_eval, without_eval, ratios = [], [], []
    try:
        credentials = stack.prepare()
        stack.start(credentials)
        client = httpx.Client(base_url=stack.config.platform_url,
                              headers={"Authorization": f"Token {credentials.user_token}"}, timeout=30)
        project = credentials.project_id
        for repeat in range(args.repeats):
            order = ("with", "without") if repeat % 2 == 0 else ("without", "with")
            speeds = {}
            for mode in order:
                run_id = run_to_end(client, stack, project, f"{mode} evaluation #{repeat}",
                                    evaluated if mode == "with" else base)
                speeds[mode] = samples_per_s(client, run_id)
            with_eval.append(speeds["with"])
            without_eval.append(speeds["without"])
            ratios.append(speeds["with"] / speeds["without"])
        long_run = run_to_end(client, stack, project, "256-episode evaluations", {
            **base, "rl_steps": 2, "evaluation": {"every_steps": 1, "tasks": 64, "samples_per_task": 4}})
        eval_seconds = evaluation_seconds(client, long_run)
    finally:
        stack.stop()
    print(json.dumps({
        "samples_per_s_with_eval": round(statistics.median(with_eval), 2),
        "samples_per_s_without_eval": round(statistics.median(without_eval), 2),
        "slowdown": round(1 - statistics.median(ratios), 3),
        "slowdowns": [round(1 - ratio, 3) for ratio in ratios],
        "eval_256_episodes_s": round(statistics.median(eval_seconds), 2) if eval_seconds else None,
        "eval_256_episodes_s_each": [round(value, 2) for value in eval_seconds],
        "config": {"rl_steps": args.rl_steps, "every_steps": args.every, "tasks": args.tasks,
                   "samples_per_task": args.samples, "repeats": args.repeats},
        "wall_s": round(time.time() - started, 1),
    }))


if __name__ == "__main__":
    main()
