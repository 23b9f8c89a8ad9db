"""An agent program through the per-episode endpoint (workers/agent_endpoint.py): what it costs, and that it learns.

Two parts, one JSON line:

- **overhead**: the same episodes, on a model published to Redis and the producer's own engine
  (PolicyRuntime, BatchingPolicy): the nano model (random weights, byte layout) and SmolLM2-135M-Instruct
  (make models; its chat template and Hermes calls), run by Tandem's agent loop against a sum
  environment, and by the ReAct agent of tests/agents/openai_react_agent.py (the ``openai`` client, no
  Tandem import) served as an HTTP agent service in a process of its own, through the endpoint. The
  tasks, prompts, tool and its answers are the same. Cost is this process's CPU seconds (the engine's
  threads, the endpoint, the agent loop: what a producer spends) per generated token, ``--episodes``
  episodes with ``--concurrency`` at once (a new one starts as one ends, as on a busy producer), sampled
  near-greedily so that both arms generate the same tokens, and the engine's counters beside; arms alternated
  ``--repeats`` times; per model, the median over repeats of endpoint / own loop; ``overhead_ratio`` is
  the last model's (``--models``, SmolLM2 by default).
- **learning**: a whole stack (web, a Celery worker, trainer; Redis db 13, flushed; a fresh SQLite
  database), the agent registered through REST as kind ``agent`` (``url``: the agent service), and
  one run that SFTs on an uploaded dataset of the built-in calculator's demonstrations, then runs
  GRPO on the agent's episodes. The run evaluates ``--eval-tasks`` held-out tasks (one greedy episode
  each, through the agent) before its first RL step, which is the SFT policy, and at its end:
  ``reward_before`` and ``reward_after``. Rewards are 0 or 1 and the tasks independent, so
  ``reward_gain_ci95`` is Newcombe's interval for the difference of the two proportions.

Usage: ``python bench/agent_endpoint.py [--parts overhead,learning] [--episodes 32] [--repeats 3]
[--rl-steps 40] [--eval-tasks 128]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from environments import (  # noqa: E402
    AgentProgramEnvironment,
    Environment,
    SharedHTTPSession,
    StepResult,
    Tool,
    shared_http_session,
)
from tandem.configs.run import RunConfig  # noqa: E402


class SumEnvironment(Environment):
    """The agent's task as a Tandem environment: the same sums of the seed, prompt, tool and answers."""

    def __init__(self):
        async def calc(arguments: dict) -> str:
            from tests.agents.openai_react_agent import calc as agent_calc
            return agent_calc(str(arguments.get("expression", "")))

        self.tools = (Tool("calc", "Evaluate an arithmetic expression of integers, + - and *.",
                           {"type": "object", "properties": {"expression": {"type": "string"}},
                            "required": ["expression"]}, calc),)
        self._sum = 0

    def sample_task(self, rng: random.Random) -> dict[str, Any]:
        return {"seed": rng.randrange(2**30)}

    async def reset(self, task: dict[str, Any]) -> str:
        rng = random.Random(task["seed"])
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        self._sum = a + b
        return f"{a}+{b}=?\n"

    async def step(self, action: str) -> StepResult:
        return StepResult(observation="", reward=1.0 if str(self._sum) in action else 0.0, done=True)


def _agent_service() -> tuple[subprocess.Popen, str]:
    import httpx

    from tandem.runtime.local_ports import free_local_port

    port = free_local_port()
    process = subprocess.Popen([sys.executable, "-m", "tests.agents.react_agent_service", "--port", str(port)],
                               cwd=Path(__file__).resolve().parents[1], stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            httpx.post(f"{url}/nothing", timeout=1)
            return process, url
        except httpx.TransportError:
            time.sleep(0.05)
    process.kill()
    raise SystemExit("the agent service did not start")


def overhead(args, service_url: str, model_name: str) -> dict:
    import redis
    from flax import nnx

    from policy import RedisWeightPublisher, create_model, load_tokenizer, split_model
    from workers.agent import EpisodeLimits, run_episode
    from workers.circuit_breaker import CircuitBreakers
    from workers.policy import BatchingPolicy, PolicyRuntime

    client = redis.Redis.from_url(args.redis_url)
    client.flushdb()
    # Near-greedy: both arms then generate the same tokens for the same prompts, whatever order their
    # turns reach the engine in, so their costs are of the same work.
    sampling = {"inference_slots": args.concurrency, "max_new_tokens": args.max_new_tokens, "temperature": 1e-3}
    for name in ("decode_chunk_tokens", "refill_hold_fraction"):
        if getattr(args, name) is not None:
            sampling[name] = getattr(args, name)
    sections = {"sampling": sampling,
                "rollout": {"max_turns": 3}}
    if model_name == "nano":
        config = RunConfig.model_validate(sections)
    else:
        from bench.real_model import real_model_config

        config = real_model_config(model={"max_seq_len": 640}, **sections)
    run_id = 999_000_032
    model = create_model(config.model, vocab_size=load_tokenizer(config.model.tokenizer).vocab_size,
                         rngs=nnx.Rngs(0))
    RedisWeightPublisher(client).publish(run_id=run_id, version=0, params=split_model(model)[1])
    runtime = PolicyRuntime(run_id=run_id, config=config, redis_client=client)
    runtime.refresh_weights(force=True)
    runtime.warm_up()
    limits = EpisodeLimits.of_run(config)

    def arm(make_environment, seed: int) -> dict:
        policy = BatchingPolicy(runtime, seed=seed)

        async def episodes():
            # As on a producer's episode loop: one HTTP session for every episode (workers/episode_loop.py).
            shared_http_session.set(SharedHTTPSession())
            slots = asyncio.Semaphore(args.concurrency)

            async def one(index: int):
                async with slots:
                    return await episode(index)

            async def episode(index: int):
                return await run_episode(
                    run_id=run_id, group_id=f"bench-{index}", group_size=1, environment_name="sums",
                    environment=make_environment(), task={"seed": 1_000 + index}, policy=policy, limits=limits,
                    tokenizer=runtime.tokenizer, layout=runtime.prompt_layout, circuit_breakers=CircuitBreakers())
            try:
                return await asyncio.gather(*[one(index) for index in range(args.episodes)])
            finally:
                await policy.close()

        stats_before = runtime.engine.stats
        cpu, wall = time.process_time(), time.perf_counter()
        records = asyncio.run(episodes())
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        stats_after = runtime.engine.stats
        engine = {name: round(getattr(stats_after, name) - getattr(stats_before, name), 3)
                  for name in ("prefill_calls", "prefill_tokens", "reused_tokens", "decode_chunks", "decode_rows",
                               "busy_s", "held_s")}
        tokens = sum(sum(record.loss_mask) for record in records)
        failed = [record.failure_reason for record in records if record.status == "failed"]
        if failed:
            raise SystemExit(f"{len(failed)} episodes failed, e.g. {failed[0]}")
        return {"cpu_s": round(cpu, 3), "wall_s": round(wall, 3), "generated_tokens": tokens,
                "cpu_ms_per_token": round(1000 * cpu / tokens, 4), "calls": sum(r.num_turns for r in records),
                "engine": engine}

    repeats = []
    try:
        arm(SumEnvironment, 0)  # warm: the endpoint server, the HTTP session, the engine's buckets
        arm(lambda: AgentProgramEnvironment(url=service_url), 0)
        for repeat in range(args.repeats):
            own = arm(SumEnvironment, repeat + 1)
            endpoint = arm(lambda: AgentProgramEnvironment(url=service_url), repeat + 1)
            repeats.append({"own_loop": own, "endpoint": endpoint,
                            "ratio": round(endpoint["cpu_ms_per_token"] / own["cpu_ms_per_token"], 4)})
            print(f"overhead repeat {repeat}: {json.dumps(repeats[-1])}", file=sys.stderr, flush=True)
    finally:
        runtime.close()
        client.flushdb()
    return {"overhead_ratio": statistics.median(r["ratio"] for r in repeats), "repeats": repeats,
            "episodes": args.episodes, "concurrency": args.concurrency, "max_new_tokens": args.max_new_tokens}


def _newcombe(successes_a: float, n_a: int, successes_b: float, n_b: int) -> tuple[float, float]:
    """95% interval of p_b - p_a (Newcombe's hybrid score method, from each proportion's Wilson interval)."""
    from tandem.contracts import wilson_interval

    p_a, p_b = successes_a / n_a, successes_b / n_b
    low_a, high_a = wilson_interval(successes_a, n_a)
    low_b, high_b = wilson_interval(successes_b, n_b)
    difference = p_b - p_a
    return (difference - math.sqrt((p_b - low_b) ** 2 + (high_a - p_a) ** 2),
            difference + math.sqrt((high_b - p_b) ** 2 + (p_a - low_a) ** 2))


def learning(args, service_url: str) -> dict:
    import httpx
    import redis

    from bench.learning import upload_calculator_demonstrations
    from tandem.cli.stack import LocalStack, StackConfig
    from tandem.contracts import TERMINAL_RUN_STATUSES

    redis.Redis.from_url(args.redis_url).flushdb()
    var_dir = Path(tempfile.mkdtemp(prefix="tandem-bench-agent-"))
    stack = LocalStack(StackConfig(redis_url=args.redis_url, port=args.port, var_dir=var_dir,
                                   database_url=f"sqlite:///{var_dir / 'bench.sqlite3'}"))
    credentials = stack.prepare()
    started = time.time()
    try:
        stack.start(credentials)
        client = httpx.Client(base_url=stack.config.platform_url,
                              headers={"Authorization": f"Token {credentials.user_token}"}, timeout=30)
        project = credentials.project_id
        # The tools the agent offers, declared: SFT renders the dataset's conversations with them, as the
        # agent's calls show them to the model (the probe checks that they are what it offers).
        from tests.agents.openai_react_agent import CALC

        client.post("/api/environments/", json={
            "project": project, "name": "react-agent", "kind": "agent",
            "settings": {"url": service_url, "timeout_s": 120}, "tools": [CALC["function"]]}).raise_for_status()
        sft = upload_calculator_demonstrations(client, project, rows=args.dataset_rows)
        while True:
            rows = client.get("/api/environments/", params={"page_size": 100}).json()
            rows = rows["results"] if isinstance(rows, dict) else rows
            status = next(row["latest_version"]["status"] for row in rows if row["name"] == "react-agent")
            if status == "ready":
                break
            if status == "failed":
                raise SystemExit("the agent environment failed its probe")
            time.sleep(1)
        # Held-out evaluations of the agent's episodes (one sample of each task, greedy): before the first RL
        # step, which is the SFT policy, and at the end.
        config = {"rl_steps": args.rl_steps, **sft, "rollout": {"max_turns": 3},
                  "evaluation": {"every_steps": 100_000, "tasks": args.eval_tasks, "samples_per_task": 1,
                                 "temperature": 0},
                  **json.loads(args.config)}
        run = client.post("/api/runs/", json={"project": project, "name": "bench: agent endpoint",
                                              "environment": "react-agent", "config": config})
        if run.status_code != 201:
            raise SystemExit(f"the run was refused: {run.text}")
        run_id = run.json()["id"]
        while (status := client.get(f"/api/runs/{run_id}/").json())["status"] not in TERMINAL_RUN_STATUSES:
            stack.check_alive()
            time.sleep(2)
        points, after = [], -1
        while page := client.get(f"/api/runs/{run_id}/metrics/", params={"after_step": after}).json():
            if not page["points"]:
                break
            points += page["points"]
            after = page["next_after_step"]
        run_config = client.get(f"/api/runs/{run_id}/").json()["config"]
        evaluations = client.get(f"/api/runs/{run_id}/evaluations/").json()["results"]
    finally:
        stack.stop()
    by_step: dict[int, dict[str, float]] = {}
    for point in points:
        by_step.setdefault(point["step"], {})[point["name"]] = point["value"]
    rewards = [values["reward_mean"] for _, values in sorted(by_step.items())
               if "reward_mean" in values and "sft_loss" not in values]
    ended = [evaluation for evaluation in evaluations if evaluation["status"] == "complete"]
    if len(ended) < 2:
        raise SystemExit(f"expected an evaluation before RL and one at the end; got {evaluations}")
    first, last = ended[0], ended[-1]
    # Rewards are 0 or 1: the mean reward is the share of successes, over independent held-out tasks.
    before, after_grpo = first["metrics"]["mean_reward"], last["metrics"]["mean_reward"]
    gain = _newcombe(before * first["episodes"], first["episodes"], after_grpo * last["episodes"], last["episodes"])
    return {"reward_before": round(before, 4), "reward_after": round(after_grpo, 4),
            "reward_gain_ci95": [round(bound, 4) for bound in gain], "run_status": status["status"],
            "evaluated_steps": [first["step"], last["step"]], "evaluation_episodes": [first["episodes"], last["episodes"]],
            "sft_steps": run_config["sft_steps"], "rl_steps": len(rewards),
            "training_reward_by_step": [round(reward, 3) for reward in rewards],
            "wall_s": round(time.time() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="overhead,learning")
    parser.add_argument("--episodes", type=int, default=64, help="episodes of each overhead arm")
    parser.add_argument("--concurrency", type=int, default=16,
                        help="overhead part: episodes at once (a new one starts as one ends, as on a producer)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", default="nano,smollm2-135m",
                        help="overhead part: nano (random weights, byte layout) and/or smollm2-135m (make models)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--decode-chunk-tokens", type=int, default=None,
                        help="overhead part: sampling.decode_chunk_tokens of both arms (default: the config's)")
    parser.add_argument("--refill-hold-fraction", type=float, default=None,
                        help="overhead part: sampling.refill_hold_fraction of both arms (default: the config's)")
    parser.add_argument("--rl-steps", type=int, default=40)
    parser.add_argument("--eval-tasks", type=int, default=128, help="held-out tasks of each evaluation")
    parser.add_argument("--dataset-rows", type=int, default=2000)
    parser.add_argument("--config", default="{}", help="JSON overrides of the learning run's config")
    parser.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13"))
    parser.add_argument("--port", type=int, default=8768)
    args = parser.parse_args()
    parts = args.parts.split(",")
    service, service_url = _agent_service()
    output: dict[str, Any] = {"bench": "agent_endpoint", "cpu_count": os.cpu_count()}
    try:
        if "overhead" in parts:
            output["overhead"] = {name: overhead(args, service_url, name) for name in args.models.split(",")}
            # The figure that stands for a deployment: the last model's (a real one by default).
            output["overhead_ratio"] = output["overhead"][args.models.split(",")[-1]]["overhead_ratio"]
        if "learning" in parts:
            output["learning"] = learning(args, service_url)
            output.update({key: output["learning"][key] for key in ("reward_before", "reward_after",
                                                                     "reward_gain_ci95")})
    finally:
        service.kill()
    print(json.dumps(output))


if __name__ == "__main__":
    main()
