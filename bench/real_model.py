"""Tandem on a real instruct model, SmolLM2-135M-Instruct (make models), on this machine: learning, generation, training.

Three parts, each also runnable alone (``--parts``); one JSON line in all:

- ``learning``: the calculator asked in words (a multi-turn, tool-using task:
  call ``calc`` in the model's own ``<tool_call>`` format, read the result,
  answer), on held-out tasks (seeds disjoint from the run's). Mean reward of
  the untrained model, then GRPO through the real pipeline (web, Celery
  producers, trainer, Redis) for at most ``--minutes``, then the mean reward
  of the policy it published, each on ``--eval-episodes`` episodes with a 95%
  Wilson interval (rewards are 0 or 1).
- ``generation``: Tandem's inference engine against ``transformers``'
  ``generate`` on the same weights and prompts, at 1 and 16 concurrent
  sessions, ``--new-tokens`` tokens each (EOS disabled on both sides, so both
  do the same work); tokens/s and their ratio. The prompts are 16 tasks of
  one environment, so they share its system message and tool schemas, which
  the engine prefills once (``tandem_shared_prompt_tokens_16``) and
  ``generate`` prefills for every row.
- ``train_step``: step time and tokens/s of the trainer's jitted GRPO update,
  full fine-tune and LoRA, on ``--train-batch`` x ``--train-len`` tokens.
- ``first_episode`` (only when asked for): ``--first-episode-runs`` runs of one RL step, one after
  the other, through one stack whose worker starts on an empty compilation cache; for each, the
  seconds from its claim to its first episode's start (the episode's own ``timings.started_at``) and
  to the first episode in the trajectory stream.

Usage: ``python bench/real_model.py [--parts learning,generation,train_step,first_episode] [--minutes 30]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import functools
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from environments.builtin.calculator import CalculatorEnvironment  # noqa: E402
from policy import (  # noqa: E402
    RedisWeightPublisher,
    Sampler,
    SamplingParams,
    create_model,
    load_tokenizer,
    policy_config,
    prompt_layout,
    split_model,
)
from tandem.configs.demo_runs import SMOLLM2_DIR  # noqa: E402
from tandem.configs.run import RunConfig  # noqa: E402
from tandem.contracts import tool_use_metrics, wilson_interval  # noqa: E402

# The calculator as the learning part asks it; its untrained reward must lie in 0.05..0.5.
ENVIRONMENT = "calculator-chat-bench"
# One-digit sums: SmolLM2-135M-Instruct gets about one in eight right untrained (0.125 on 16 tries).
ENVIRONMENT_SETTINGS = {"prompt_style": "chat", "min_operand": 1, "max_operand": 9, "operators": "+"}
# Held-out tasks come from seeds far from the run's (group_task_seed(seed, i) for small i).
HELD_OUT_SEED = 10**9


def real_model_config(directory: Path = SMOLLM2_DIR, **overrides) -> RunConfig:
    """The settings of the real-model benches for the model imported in ``directory`` (SmolLM2 by default)."""
    directory = str(directory.resolve())
    base = {
        # The prompt (the tool's system message included) is about 170 tokens; a call, its result and
        # an answer fit in 320. One group of 8 a step: the update of 16 such episodes took more than
        # 13 GB on this CPU (float32 logits over 49,152 tokens, no micro-batching) and was OOM-killed.
        "model": {"hf_checkpoint": directory, "tokenizer": directory, "max_seq_len": 320},
        "sampling": {"max_new_tokens": 40, "temperature": 0.8},
        "rollout": {"group_size": 8, "groups_per_step": 1, "groups_per_task": 1, "max_turns": 2},
    }
    for key, value in overrides.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return RunConfig.model_validate(base)


# -- learning ------------------------------------------------------------------------------


def evaluate(redis_client, *, run_id: int, config: RunConfig, episodes: int,
             make_environment=lambda: CalculatorEnvironment(**ENVIRONMENT_SETTINGS),
             environment_name: str = ENVIRONMENT, evaluation_split: bool = False) -> dict:
    """Mean reward of the policy published under ``run_id`` on held-out tasks of ``make_environment()``'s
    (by default the learning part's calculator), and its episodes' tool use. ``evaluation_split``: tasks of the
    environment's own held-out split (``sample_evaluation_task``), not training tasks of far seeds."""
    from workers.agent import EpisodeLimits, run_episode
    from workers.policy import BatchingPolicy, PolicyRuntime

    runtime = PolicyRuntime(run_id=run_id, config=config.model_copy(update={"sampling": config.sampling.model_copy(
        update={"inference_slots": episodes})}), redis_client=redis_client)
    version = runtime.refresh_weights(force=True)
    policy = BatchingPolicy(runtime, seed=HELD_OUT_SEED)
    limits = EpisodeLimits(max_turns=config.rollout.max_turns, max_seq_len=config.model.max_seq_len,
                           max_new_tokens=config.sampling.max_new_tokens, environment_timeout_s=30.0)

    tasks: dict[int, dict] = {}

    async def all_episodes():
        async def one(index: int):
            environment = make_environment()
            draw = environment.sample_evaluation_task if evaluation_split else environment.sample_task
            task = draw(random.Random(HELD_OUT_SEED + index))
            tasks[index] = task
            return await run_episode(run_id=run_id, group_id=f"eval-{index}", group_size=1,
                                     environment_name=environment_name, environment=environment, task=task,
                                     policy=policy, limits=limits, tokenizer=runtime.tokenizer,
                                     layout=runtime.prompt_layout)
        try:
            return await asyncio.gather(*[one(index) for index in range(episodes)])
        finally:
            await policy.close()

    started = time.perf_counter()
    try:
        records = asyncio.run(all_episodes())
    finally:
        runtime.close()
    rewards = [record.reward for record in records]
    tool_calls = sum(any(m.tool_calls for m in record.messages) for record in records)
    tools = tool_use_metrics(records) if any(record.offered_tools for record in records) else {}
    return {
        "tool_use": {name: round(value, 4) for name, value in tools.items()},
        "examples": [[message.content for message in record.messages if message.role != "system"]
                     for record in records[:3]],
        # Every episode in brief, to read how the misses split (by the task's shape, say).
        "outcomes": [{"task": tasks[index], "reward": record.reward, "status": record.status,
                      "calls": record.tool_calls_run(), "answer": _last_policy_text(record)[-200:]}
                     for index, record in enumerate(records)],
        "policy_version": version,
        "mean": round(statistics.fmean(rewards), 4),
        "ci95": tuple(round(bound, 4) for bound in wilson_interval(sum(rewards), len(rewards))),
        "episodes": len(rewards),
        "episodes_calling_tools": tool_calls,
        "statuses": {status: sum(r.status == status for r in records) for status in ("ok", "truncated", "failed")},
        "wall_s": round(time.perf_counter() - started, 1),
    }


def _last_policy_text(record) -> str:
    texts = [message.content for message in record.messages if message.role == "assistant"]
    return texts[-1] if texts else ""


@contextlib.contextmanager
def bench_stack(args, *, environ: dict[str, str] | None = None):
    """A whole stack (web, one Celery worker, trainer) on ``args.redis_url`` and a fresh SQLite database, its
    project holding the built-in environments: yields an API client, the project's id and the stack."""
    import httpx

    from tandem.cli.stack import LocalStack, StackConfig

    var_dir = Path(tempfile.mkdtemp(prefix="tandem-bench-real-"))
    os.environ.update(environ or {})
    stack = LocalStack(StackConfig(redis_url=args.redis_url, port=args.port, var_dir=var_dir, workers=1,
                                   database_url=f"sqlite:///{var_dir / 'bench.sqlite3'}"))
    credentials = stack.prepare()
    try:
        stack.start(credentials)
        client = httpx.Client(base_url=stack.config.platform_url,
                              headers={"Authorization": f"Token {credentials.user_token}"}, timeout=30)
        yield client, credentials.project_id, stack
    finally:
        stack.stop()


@contextlib.contextmanager
def _calculator_stack(args, *, environ: dict[str, str] | None = None):
    """``bench_stack`` with the learning part's calculator registered."""
    with bench_stack(args, environ=environ) as (client, project_id, stack):
        environment = client.post("/api/environments/", json={
            "project": project_id, "name": ENVIRONMENT, "kind": "python",
            "entrypoint": "environments.builtin.calculator:CalculatorEnvironment",
            "settings": ENVIRONMENT_SETTINGS, "tools": [tool_schema()],
        })
        environment.raise_for_status()
        yield client, project_id, stack


def _environment_ready(client, stack, name: str, *, timeout_s: float = 600.0) -> None:
    """Wait for ``name``'s newest version to pass its probe: a fresh stack probes its environments one after
    another, and a run of SFT on one whose demonstrations are not yet probed is refused."""
    deadline = time.time() + timeout_s
    while True:
        stack.check_alive()
        listed = client.get("/api/environments/", params={"page_size": 100}).json()
        rows = listed["results"] if isinstance(listed, dict) else listed
        status = next((row["latest_version"]["status"] for row in rows if row["name"] == name), None)
        if status == "ready":
            return
        if status == "failed" or time.time() > deadline:
            raise RuntimeError(f"environment {name} is {status} (not ready)")
        time.sleep(2)


def run_to_end(client, stack, *, project_id: int, name: str, environment: str, config: dict,
               minutes: float, rl_minutes: float | None = None) -> dict:
    """Create a run through REST and wait for it to end, cancelling it once ``minutes`` have passed, or, with
    ``rl_minutes``, that many minutes after its first RL step ended (the steps after ``config["sft_steps"]``),
    so that the engine's warm-up and the first step's compilation (minutes on a CPU) are not counted: its
    id, final status, trainer step, wall seconds, and the seconds from the first RL step to the end."""
    from tandem.contracts import TERMINAL_RUN_STATUSES

    _environment_ready(client, stack, environment)
    started = time.time()
    run = client.post("/api/runs/", json={"project": project_id, "name": name, "environment": environment,
                                          "config": config})
    if run.status_code != 201:
        raise RuntimeError(f"the run was refused: {run.status_code} {run.text}")
    run_id = run.json()["id"]
    deadline, cancelled, first_rl_step_at = started + minutes * 60, False, None
    while True:
        stack.check_alive()
        status = client.get(f"/api/runs/{run_id}/").json()
        if status["status"] in TERMINAL_RUN_STATUSES:
            break
        if (rl_minutes is not None and first_rl_step_at is None
                and (status.get("trainer_step") or 0) > config.get("sft_steps", 0)):
            first_rl_step_at = time.time()
            deadline = first_rl_step_at + rl_minutes * 60
        if time.time() > deadline and not cancelled:
            client.post(f"/api/runs/{run_id}/cancel/").raise_for_status()
            cancelled = True
        time.sleep(5)
    ended = time.time()
    return {"run_id": run_id, "status": status["status"], "trainer_step": status.get("trainer_step", 0),
            "wall_s": round(ended - started, 1),
            "after_first_rl_step_s": None if first_rl_step_at is None else round(ended - first_rl_step_at, 1)}


def learning(args) -> dict:
    import redis

    redis_client = redis.Redis.from_url(args.redis_url)
    redis_client.flushdb()
    mode = "lora" if args.lora else "full"
    overrides = {"lora": {"enabled": True, "rank": 16, "alpha": 32.0}} if args.lora else {}
    config = real_model_config(**overrides)
    tokenizer = load_tokenizer(config.model.tokenizer)
    base = create_model(config.model, vocab_size=tokenizer.vocab_size, rngs=None)
    base_run_id = 999_000_001
    RedisWeightPublisher(redis_client).publish(run_id=base_run_id, version=0, params=split_model(base)[1])
    del base
    before = evaluate(redis_client, run_id=base_run_id, config=config, episodes=args.eval_episodes)
    print(f"before: {before}", file=sys.stderr)

    with _calculator_stack(args) as (client, project_id, stack):
        run_config = json.loads(config.model_dump_json())
        run_config.update({"sft_steps": 0, "rl_steps": args.rl_steps, "rl_learning_rate": args.learning_rate,
                           "checkpoint": {"every": 1000}})
        run = run_to_end(client, stack, project_id=project_id, name="bench: real model", environment=ENVIRONMENT,
                         config=run_config, minutes=args.minutes)
    run_id, run_status, steps, wall_s = run["run_id"], run["status"], run["trainer_step"], run["wall_s"]
    after = evaluate(redis_client, run_id=run_id, config=config, episodes=args.eval_episodes)
    print(f"after: {after}", file=sys.stderr)
    return {
        "environment": f"{ENVIRONMENT} ({json.dumps(ENVIRONMENT_SETTINGS, sort_keys=True)})",
        "mode": mode,
        "reward_before": before["mean"],
        "reward_before_ci95": before["ci95"],
        "reward_after": after["mean"],
        "reward_after_ci95": after["ci95"],
        "wall_s": round(wall_s, 1),
        "run_status": run_status,
        "rl_steps_done": steps,
        "policy_version_after": after["policy_version"],
        "eval_episodes": args.eval_episodes,
        "details": {"before": before, "after": after},
    }


def tool_schema() -> dict:
    (tool,) = CalculatorEnvironment.tools
    return {"name": tool.name, "description": tool.description, "parameters": tool.parameters}


# -- generation ------------------------------------------------------------------------------


def chat_prompts(count: int) -> list[list[int]]:
    config = real_model_config()
    tokenizer = load_tokenizer(config.model.tokenizer)
    layout = prompt_layout(config.model, tokenizer)
    environment = CalculatorEnvironment(**ENVIRONMENT_SETTINGS)
    prompts = []
    for index in range(count):
        task = environment.sample_task(random.Random(index))
        prompt = asyncio.run(environment.reset(task))
        prompts.append(layout.start(prompt, environment.tools).token_ids)
    return prompts


def generation(args) -> dict:
    import torch
    import transformers

    config = real_model_config()
    tokenizer = load_tokenizer(config.model.tokenizer)
    model = create_model(config.model, vocab_size=tokenizer.vocab_size, rngs=None)
    graphdef, params = split_model(model)
    transformer_config = policy_config(config.model, vocab_size=tokenizer.vocab_size)
    prompts = chat_prompts(16)
    new_tokens = args.new_tokens
    # EOS off on both sides (an id no logit has): every session generates exactly new_tokens.
    sampler = Sampler(graphdef, config=transformer_config, eos_id=-1, pad_id=tokenizer.pad_id,
                      batch_buckets=(1, 16), prompt_buckets=(16, 32, 64, 128, 256))
    reference = transformers.AutoModelForCausalLM.from_pretrained(str(SMOLLM2_DIR.resolve()),
                                                                  torch_dtype=torch.float32)
    reference.eval()
    results, shared = {}, {}
    for sessions in (1, 16):
        batch = prompts[:sessions]
        sampler.generate(params, batch, SamplingParams(max_new_tokens=new_tokens, seed=0))  # compiles
        shared_before = sampler.engine.stats.shared_tokens
        began = time.perf_counter()
        completions = sampler.generate(params, batch, SamplingParams(max_new_tokens=new_tokens, seed=1))
        tandem_s = time.perf_counter() - began
        shared[sessions] = sampler.engine.stats.shared_tokens - shared_before
        tandem_tokens = sum(len(c.token_ids) for c in completions)

        width = max(map(len, batch))
        input_ids = torch.tensor([[tokenizer.pad_id] * (width - len(p)) + p for p in batch])
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        kwargs = dict(attention_mask=attention, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                      max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=tokenizer.pad_id)
        with torch.no_grad():
            reference.generate(input_ids, **kwargs)  # warm-up
            began = time.perf_counter()
            output = reference.generate(input_ids, **kwargs)
            reference_s = time.perf_counter() - began
        reference_tokens = int((output.shape[1] - width) * sessions)
        results[sessions] = (tandem_tokens / tandem_s, reference_tokens / reference_s)
    return {
        "tandem_tokens_per_s_1": round(results[1][0], 1),
        "tandem_tokens_per_s_16": round(results[16][0], 1),
        "transformers_tokens_per_s_1": round(results[1][1], 1),
        "transformers_tokens_per_s_16": round(results[16][1], 1),
        "ratio_1": round(results[1][0] / results[1][1], 2),
        "ratio_16": round(results[16][0] / results[16][1], 2),
        "new_tokens": new_tokens,
        "prompt_tokens": [len(p) for p in prompts],
        # Prompt tokens the engine copied from another session's cached prefix instead of prefilling.
        "tandem_shared_prompt_tokens_16": shared[16],
        "torch_threads": torch.get_num_threads(),
    }


# -- train_step ------------------------------------------------------------------------------


def train_step_times(args) -> dict:
    from trainer.losses import grpo_loss
    from trainer.train_batch import pad_batch
    from trainer.train_state import initial_train_state, make_optimizer
    from trainer.train_step import make_train_step, on_token_statistics

    results = {}
    for mode in ("full", "lora"):
        lora = {"lora": {"enabled": True, "rank": 16, "alpha": 32.0}} if mode == "lora" else {}
        config = real_model_config(**lora)
        tokenizer = load_tokenizer(config.model.tokenizer)
        optimizer = make_optimizer(1e-5)
        graphdef, state = initial_train_state(config, vocab_size=tokenizer.vocab_size, needs_value_head=False,
                                              optimizer=optimizer)
        step = make_train_step(graphdef, optimizer, on_token_statistics(functools.partial(grpo_loss, clip_epsilon=0.2)))
        rng = np.random.default_rng(0)
        length, rows = args.train_len, args.train_batch
        batches = [pad_batch(
            [rng.integers(0, tokenizer.vocab_size, size=length).tolist() for _ in range(rows)],
            loss_masks=[[0] * (length // 2) + [1] * (length - length // 2)] * rows,
            behaviour_logprobs=[[0.0] * (length // 2) + [-1.0] * (length - length // 2)] * rows,
            advantages=rng.standard_normal(rows).tolist(), batch_size=rows, length_buckets=(length,),
            pad_id=tokenizer.pad_id) for _ in range(2)]
        state, metrics = step(state, batches[0])
        jax.block_until_ready((state, metrics))
        times = []
        for index in range(args.train_steps):
            began = time.perf_counter()
            state, metrics = step(state, batches[index % 2])
            jax.block_until_ready((state, metrics))
            times.append(time.perf_counter() - began)
        step_s = statistics.median(times)
        results[f"{mode}_step_s"] = round(step_s, 3)
        results[f"{mode}_tokens_per_s"] = round(rows * length / step_s, 1)
        del state
    results.update({"batch": args.train_batch, "seq_len": args.train_len, "timed_steps": args.train_steps})
    return results


def first_episode(args) -> dict:
    """Runs of the model one after the other through one stack, whose one worker starts on an empty
    compilation cache: from each run's claim (its ``started_at``) to its first episode's start (the
    earliest ``timings.started_at`` among the first episodes in the stream) and to its first episode in
    the trajectory stream (the entry's id is the time Redis took it), and the run's status."""
    import redis

    from policy.compilation_cache import CACHE_DIR_VARIABLE
    from tandem.contracts import TERMINAL_RUN_STATUSES, TrajectoryRecord
    from tandem.contracts.keys import trajectory_stream

    redis_client = redis.Redis.from_url(args.redis_url)
    redis_client.flushdb()
    run_config = json.loads(real_model_config().model_dump_json())
    run_config.update({"sft_steps": 0, "rl_steps": 1, "checkpoint": {"every": 1000}})
    cache_dir = tempfile.mkdtemp(prefix="tandem-bench-jax-cache-")
    runs = []
    with _calculator_stack(args, environ={CACHE_DIR_VARIABLE: cache_dir}) as (client, project_id, stack):
        for index in range(args.first_episode_runs):
            created = client.post("/api/runs/", json={"project": project_id, "name": f"bench: first episode {index}",
                                                      "environment": ENVIRONMENT, "config": run_config})
            created.raise_for_status()
            run_id = created.json()["id"]
            first_entry_ms, first_started_at = None, None
            deadline = time.time() + args.minutes * 60
            while True:
                stack.check_alive()
                if first_entry_ms is None:
                    entries = redis_client.xrange(trajectory_stream(run_id))
                    if entries:
                        first_entry_ms = int(entries[0][0].split(b"-")[0])
                        # The episodes of the first group start together; the first to end need not
                        # have started first.
                        first_started_at = min(TrajectoryRecord.from_stream_fields(fields).timings.started_at
                                               for _, fields in entries)
                run = client.get(f"/api/runs/{run_id}/").json()
                if run["status"] in TERMINAL_RUN_STATUSES or time.time() > deadline:
                    break
                time.sleep(0.5)
            claimed = datetime.datetime.fromisoformat(run["started_at"]).timestamp() if run["started_at"] else None
            runs.append({"run_id": run_id, "status": run["status"], "status_reason": run["status_reason"],
                         "claim_to_first_episode_s": (round(first_started_at - claimed, 1)
                                                      if claimed and first_started_at else None),
                         "claim_to_first_episode_end_s": (round(first_entry_ms / 1000 - claimed, 1)
                                                          if claimed and first_entry_ms else None)})
            print(f"first episode, run {index}: {runs[-1]}", file=sys.stderr, flush=True)
    return {"runs": runs, "claim_to_first_episode_s": [run["claim_to_first_episode_s"] for run in runs],
            "claim_to_first_episode_end_s": [run["claim_to_first_episode_end_s"] for run in runs],
            "compilation_cache": "empty at the worker's start", "load_average_1m": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="learning,generation,train_step")
    parser.add_argument("--minutes", type=float, default=30.0, help="wall-time budget of the GRPO run")
    parser.add_argument("--rl-steps", type=int, default=200, help="the run's rl_steps (the budget usually ends it)")
    parser.add_argument("--learning-rate", type=float, default=3e-5, help="the run's rl_learning_rate")
    parser.add_argument("--lora", action="store_true", help="train LoRA adapters instead of every weight")
    parser.add_argument("--eval-episodes", type=int, default=64)
    parser.add_argument("--first-episode-runs", type=int, default=2,
                        help="first_episode: runs one after the other on the same worker")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--train-batch", type=int, default=4)
    parser.add_argument("--train-len", type=int, default=256)
    parser.add_argument("--train-steps", type=int, default=3)
    parser.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13"))
    parser.add_argument("--port", type=int, default=8766)
    args = parser.parse_args()
    if not (SMOLLM2_DIR / "config.json").is_file():
        sys.exit(f"{SMOLLM2_DIR} holds no model: run `make models` first")
    parts = args.parts.split(",")
    output: dict = {"model": "SmolLM2-135M-Instruct", "backend": jax.default_backend(),
                    "device": jax.devices()[0].device_kind, "cpu_count": os.cpu_count()}
    for part, measure in (("train_step", train_step_times), ("generation", generation), ("learning", learning),
                          ("first_episode", first_episode)):
        if part in parts:
            output[part] = measure(args)
            print(f"{part}: {json.dumps(output[part])}", file=sys.stderr, flush=True)
    print(json.dumps(output))


if __name__ == "__main__":
    main()
