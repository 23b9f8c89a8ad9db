"""Does GRPO raise the calculator task's success rate after the SFT warm-up?

Runs the real pipeline (web, Celery producers, trainer, Redis) on the demo
configuration and compares the success rate of the first RL steps (the SFT
policy, before GRPO changed it) with that of the last RL steps. Prints one
JSON line. Usage: ``python bench/learning.py [--rl-steps N] [--database-url URL]``
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

from tandem.contracts import TERMINAL_RUN_STATUSES  # noqa: E402
from tandem.stack import LocalStack, StackConfig  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rl-steps", type=int, default=40)
    parser.add_argument("--window", type=int, default=5, help="RL steps averaged at each end")
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
    try:
        stack.start(credentials)
        client = httpx.Client(base_url=stack.config.platform_url,
                              headers={"Authorization": f"Token {credentials.user_token}"}, timeout=10)
        config = {"rl_steps": args.rl_steps, **json.loads(args.config)}
        run = client.post("/api/runs/", json={"project": credentials.project_id, "name": "bench",
                                              "environment": "calculator", "config": config})
        run.raise_for_status()
        run_id = run.json()["id"]
        while True:
            stack.check_alive()
            status = client.get(f"/api/runs/{run_id}/").json()
            if status["status"] in TERMINAL_RUN_STATUSES:
                break
            time.sleep(2)
        points, after = [], -1
        while True:
            page = client.get(f"/api/runs/{run_id}/metrics/", params={"after_step": after}).json()
            if not page["points"]:
                break
            points += page["points"]
            after = page["next_after_step"]
    finally:
        stack.stop()

    def series(name):
        return [p["value"] for p in sorted(points, key=lambda p: p["step"]) if p["name"] == name]

    success = series("success_rate")
    idle = series("trainer_idle_fraction")
    window = min(args.window, max(len(success) // 2, 1))
    print(json.dumps({
        "run_status": status["status"],
        "rl_steps": len(success),
        "success_rate_before_grpo": sum(success[:window]) / window if success else None,
        "success_rate_after_grpo": sum(success[-window:]) / window if success else None,
        "success_rate_by_step": [round(s, 3) for s in success],
        "trainer_idle_fraction_rl_mean": sum(idle[-len(success):]) / len(success) if success else None,
        "wall_s": round(time.time() - started, 1),
    }))


if __name__ == "__main__":
    main()
