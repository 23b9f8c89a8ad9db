"""Does a real model learn to use its tools? SmolLM2-135M-Instruct (make models) on two tasks that need them.

- ``calculator``: 3-digit products asked in words (the ``calculator-products`` preset), one ``calc`` call;
- ``multi_step``: the ``shop`` environment, an order's total from prices only its ``lookup`` tool knows,
  summed with ``calc``: at least three calls of two tools.

Each arm is evaluated on ``--eval-episodes`` held-out episodes (the environment's own evaluation split),
in the model's own ``<tool_call>`` format: mean reward with its 95% Wilson interval, the share of
episodes that called a tool and saw it run (``tool_call_rate``), the share of the turns that wrote
call markup which did not parse (``parse_failure_rate``, null when none wrote any), calls that ran per
episode and wall time; ``examples`` quotes three episodes. Arms: ``imported``, the model as imported
(issue 31 asks it to score at most 0.05 on each task, so that the tool is needed). The trained arms
(``sft``, ``sft_grpo``, ``grpo``, ``grpo_bonus``) are not built yet.

Usage: ``python bench/tool_learning.py [--tasks calculator,multi_step] [--eval-episodes 64]``. Prints one
JSON line. Uses the Redis of ``--redis-url`` (db 14 by default) for the published weights, and deletes them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.real_model import evaluate, real_model_config  # noqa: E402
from environments.builtin.calculator import CalculatorEnvironment  # noqa: E402
from environments.builtin.shop import ShopEnvironment  # noqa: E402
from policy import RedisWeightPublisher, create_model, load_tokenizer, split_model  # noqa: E402
from tandem.configs.demo_runs import SMOLLM2_DIR  # noqa: E402

# As the platform registers them (platform/environment_registry/builtin.py).
TASKS = {
    "calculator": ("calculator-products", lambda: CalculatorEnvironment(
        prompt_style="chat", min_operand=100, max_operand=999, operators="*"), 3),
    "multi_step": ("shop", ShopEnvironment, 6),
}
IMPORTED_RUN_ID = 999_000_031


def _arm(result: dict) -> dict:
    tools = result["tool_use"]
    return {
        "reward": result["mean"], "reward_ci95": result["ci95"],
        "tool_call_rate": tools.get("tool_call_rate"), "parse_failure_rate": tools.get("tool_parse_failure_rate"),
        "calls_per_episode": tools.get("tool_calls_per_episode"), "wall_s": result["wall_s"],
        "episodes": result["episodes"], "statuses": result["statuses"], "tool_use": tools,
        "examples": result["examples"],
    }


def main() -> None:
    import redis

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default="calculator,multi_step")
    parser.add_argument("--eval-episodes", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/14"))
    args = parser.parse_args()
    if not (SMOLLM2_DIR / "config.json").is_file():
        sys.exit(f"{SMOLLM2_DIR} holds no model: run `make models` first")
    redis_client = redis.Redis.from_url(args.redis_url)
    output: dict = {"bench": "tool_learning", "model": "SmolLM2-135M-Instruct", "eval_episodes": args.eval_episodes}
    publisher = RedisWeightPublisher(redis_client)
    try:
        for task in args.tasks.split(","):
            environment_name, make_environment, max_turns = TASKS[task]
            config = real_model_config(model={"max_seq_len": 1024},
                                       sampling={"max_new_tokens": args.max_new_tokens, "temperature": 0.8},
                                       rollout={"max_turns": max_turns})
            tokenizer = load_tokenizer(config.model.tokenizer)
            base = create_model(config.model, vocab_size=tokenizer.vocab_size, rngs=None)
            publisher.publish(run_id=IMPORTED_RUN_ID, version=0, params=split_model(base)[1])
            del base
            result = evaluate(redis_client, run_id=IMPORTED_RUN_ID, config=config, episodes=args.eval_episodes,
                              make_environment=make_environment, environment_name=environment_name,
                              evaluation_split=True)
            output[task] = {"environment": environment_name, "imported": _arm(result)}
            print(f"{task}: {json.dumps(output[task])}", file=sys.stderr, flush=True)
    finally:
        for key in redis_client.scan_iter(f"*{IMPORTED_RUN_ID}*"):
            redis_client.delete(key)
    print(json.dumps(output))


if __name__ == "__main__":
    main()
