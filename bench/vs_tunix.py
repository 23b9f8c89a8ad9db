"""Tandem's agentic GRPO step against Tunix's agentic and plain GRPO steps, in one run.

Both sides use the same tiny decoder (2 layers, d_model 64, 4 heads, SwiGLU
256, byte vocabulary of 259 ids), 4 tasks x 4 episodes per step, at most 16
new tokens per model call, temperature 1, no KL term, one update per step.

- Tunix runs as a subprocess in its own virtual environment (it is never a
  dependency of Tandem): ``bench/tunix_reference.py`` times its plain
  ``GRPOLearner`` and its agentic ``GRPOLearner`` on a two-turn toy
  environment, and prints its own JSON.
- Tandem runs here, through its real producer and trainer code: 16 concurrent
  ``workers.agent.run_episode`` episodes of the same two-turn environment
  share one ``workers.policy.BatchingPolicy`` on the run's ``PolicyRuntime``,
  which samples with the weights the trainer published to Redis
  (``policy.weights``); then, as ``trainer.run_loop`` does, the GRPO
  algorithm's ``prepare`` (advantages) and ``batch`` (padding) and the jitted
  ``make_train_step`` update, and the new weights are published for the next
  step. A step is all of that, timed after warm-up and after every shape
  bucket has been compiled once.

Tandem's producers and trainer normally overlap (generation runs while the
trainer trains); here they run one after the other, as Tunix's colocated
learners do, so the step times compare like with like. The trajectory stream
between producer and trainer is not part of the step.

Prints one JSON line. Usage:
``python bench/vs_tunix.py [--steps N] [--tunix-python .bench-venv-tunix/bin/python]``
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import redis  # noqa: E402
from flax import nnx  # noqa: E402

from environments import Environment, StepResult  # noqa: E402
from policy import ByteTokenizer, RedisWeightPublisher, Transformer, TransformerConfig  # noqa: E402
from tandem.configs.rollout import RolloutConfig, SamplingConfig  # noqa: E402
from tandem.configs.run import RunConfig  # noqa: E402
from tandem.contracts import weights_key  # noqa: E402
from trainer.algorithms import build_algorithm  # noqa: E402
from trainer.run_loop import length_buckets  # noqa: E402
from trainer.train_batch import pad_batch  # noqa: E402
from trainer.train_state import create_train_state, make_optimizer  # noqa: E402
from trainer.train_step import make_train_step  # noqa: E402
from workers.agent import EpisodeLimits, run_episode  # noqa: E402
from workers.policy import BatchingPolicy, PolicyRuntime  # noqa: E402

DEFAULT_TUNIX_PYTHON = REPO_ROOT / ".bench-venv-tunix" / "bin" / "python"
# Tandem's bar: its agentic step within this factor of Tunix's plain (single-turn) step.
PLAIN_STEP_TARGET_RATIO = 1.5


class TwoTurnEnvironment(Environment):
    """The same toy task as tunix_reference.TwoTurnEnvironment: ask, hint, score."""

    def sample_task(self, rng: random.Random) -> dict[str, Any]:
        return {"a": rng.randrange(10), "b": rng.randrange(10)}

    async def reset(self, task: dict[str, Any]) -> str:
        self._turn = 0
        return f"Add {task['a']} and {task['b']}."

    async def step(self, action: str) -> StepResult:
        self._turn += 1
        if self._turn == 1:
            return StepResult(observation="Try again, digits only:", reward=0.0, done=False)
        return StepResult(observation="", reward=float(any(c.isdigit() for c in action)), done=True)


class CompileCounter:
    """Counts XLA compilations through jax.monitoring while armed."""

    def __init__(self):
        self.armed = False
        self.count = 0
        self.seconds = 0.0
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, event: str, duration: float, **kwargs: Any) -> None:
        if self.armed and event == "/jax/core/compile/backend_compile_duration":
            self.count += 1
            self.seconds += duration


def engine_counters(runtime: PolicyRuntime) -> dict[str, float]:
    """The inference engine's cumulative counters (prefills, decode chunks, tokens), if it has any."""
    engine = getattr(runtime, "engine", None)
    stats = getattr(engine, "stats", None)
    if stats is None or not dataclasses.is_dataclass(stats):
        return {}
    return {key: value for key, value in dataclasses.asdict(stats).items()
            if isinstance(value, int | float) and key != "busy_s"}


def free_run_id(client: redis.Redis) -> int:
    """A run id whose weights key nobody uses, so the benchmark touches no one else's keys."""
    for offset in range(1000):
        run_id = 990_000 + (os.getpid() + offset) % 9_000
        if not client.exists(weights_key(run_id)):
            return run_id
    raise RuntimeError("no free benchmark run id in 990000..998999")


def compile_every_bucket(runtime: PolicyRuntime, rl_step, state, buckets, pad_id: int) -> None:
    """Compile what Tandem compiles once per shape bucket, so no timed step pays for it.

    A long-running trainer and producer compile each bucket once and never
    again; a handful of warm-up steps need not hit every bucket. The train
    step runs on a copy of the state (it donates its input) and a fully
    masked batch, so the real state is untouched.
    """
    runtime.refresh_weights(force=True)
    warmup = getattr(getattr(runtime, "engine", None), "warmup", None)
    if warmup is not None:
        warmup()
    for length in buckets:
        batch = pad_batch([[pad_id] * length], loss_masks=[[0] * length], behaviour_logprobs=None,
                          advantages=None, batch_size=runtime.config.rollout.episodes_per_step,
                          length_buckets=buckets, pad_id=pad_id)
        _, metrics = rl_step(jax.tree.map(jnp.copy, state), batch)
        jax.block_until_ready(metrics)


async def tandem_agentic(args, counter: CompileCounter) -> dict[str, Any]:
    # groups_per_task: one rollout task runs all of a step's groups, 16 concurrent episodes.
    config = RunConfig(
        rollout=RolloutConfig(groups_per_step=args.prompts, group_size=args.generations,
                              groups_per_task=args.prompts, max_turns=2),
        sampling=SamplingConfig(max_new_tokens=args.new_tokens, temperature=1.0), seed=args.seed,
    )
    tokenizer = ByteTokenizer()
    client = redis.Redis.from_url(args.redis_url)
    run_id = free_run_id(client)
    try:
        # Trainer side, as trainer.run_loop.RunTrainer builds it (GRPO: no
        # reference policy, no value head).
        model_config = TransformerConfig.from_model_config(config.model, tokenizer.vocab_size)
        algorithm = build_algorithm(config.algorithm, temperature=config.sampling.temperature,
                                    max_policy_tokens=config.sampling.max_new_tokens * config.rollout.max_turns)
        if algorithm.needs_reference or algorithm.needs_value_head:
            raise RuntimeError("the benchmark expects plain GRPO: no KL penalty, no value head")
        optimizer = make_optimizer(config.rl_learning_rate)
        graphdef, state = create_train_state(
            Transformer(model_config, rngs=nnx.Rngs(config.seed)), optimizer
        )
        rl_step = make_train_step(graphdef, optimizer, algorithm.loss_fn)
        buckets = length_buckets(config.model.max_seq_len)
        publisher = RedisWeightPublisher(client)
        version = 0
        publisher.publish(run_id=run_id, version=version, params=state.params)
        first_weight = np.array(jax.tree.leaves(state.params)[0])

        # Producer side, as workers.producer sets it up: one warm runtime per
        # run, and per rollout task a forced weight refresh and a BatchingPolicy.
        runtime = PolicyRuntime(run_id=run_id, config=config, redis_client=client)
        warmup_started = time.perf_counter()
        compile_every_bucket(runtime, rl_step, state, buckets, tokenizer.pad_id)
        setup_compile_s = time.perf_counter() - warmup_started
        limits = EpisodeLimits(max_turns=config.rollout.max_turns, max_seq_len=config.model.max_seq_len,
                               max_new_tokens=config.sampling.max_new_tokens,
                               environment_timeout_s=config.rollout.environment_timeout_s)
        task_rng = random.Random(config.seed)
        steps = []

        async def rollout(step: int) -> dict[str, Any]:
            """One rollout task's worth of episodes, as workers.producer.produce runs them."""
            started = time.perf_counter()
            # As the producer does: pick up the newest published weights first.
            weights_version = runtime.refresh_weights(force=True)
            fetched = time.perf_counter()
            policy = BatchingPolicy(runtime, seed=config.seed * 1_000_003 + step)
            tasks = [TwoTurnEnvironment().sample_task(task_rng) for _ in range(config.rollout.groups_per_step)]
            records = await asyncio.gather(*(
                run_episode(run_id=run_id, group_id=f"bench-{step}-{group}",
                            group_size=config.rollout.group_size, environment_name="two_turn",
                            environment=TwoTurnEnvironment(), task=task, policy=policy,
                            limits=limits, tokenizer=tokenizer)
                for group, task in enumerate(tasks) for _ in range(config.rollout.group_size)
            ))
            await policy.close()
            return {"records": records, "weight_fetch_s": fetched - started,
                    "rollout_s": time.perf_counter() - fetched, "generation_s": policy.generation_s,
                    "weights_version": weights_version}

        def train(records) -> dict[str, Any]:
            """As the trainer's RL phase does it: advantages, padding, update, publish."""
            nonlocal state, version
            started = time.perf_counter()
            groups = [records[start:start + config.rollout.group_size]
                      for start in range(0, len(records), config.rollout.group_size)]
            prepared = algorithm.prepare(groups)
            batched = time.perf_counter()
            batch = algorithm.batch(prepared, batch_size=config.rollout.episodes_per_step,
                                    length_buckets=buckets, pad_id=tokenizer.pad_id)
            state, metrics = rl_step(state, batch)
            metrics = {name: float(value) for name, value in jax.device_get(metrics).items()}
            trained = time.perf_counter()
            version += 1
            publisher.publish(run_id=run_id, version=version, params=state.params)
            return {"train_s": trained - started, "advantages_s": batched - started,
                    "batch_and_update_s": trained - batched, "publish_s": time.perf_counter() - trained,
                    "train_seq_len": int(batch.tokens.shape[1]), "loss": metrics["loss"]}

        try:
            # Overlapped: the rollouts of step k + 1 run while step k trains, as
            # Tandem's producers and trainer do (staleness 1). Sequential: one
            # after the other, the generate-then-train loop.
            pending = asyncio.create_task(rollout(0)) if args.overlap else None
            step_started = time.perf_counter()
            for step in range(args.warmup + args.steps):
                counter.armed = step >= args.warmup
                counters_before = engine_counters(runtime)
                rolled = await pending if args.overlap else await rollout(step)
                if args.overlap and step + 1 < args.warmup + args.steps:
                    pending = asyncio.create_task(rollout(step + 1))
                records = rolled["records"]
                trained = await asyncio.to_thread(train, records) if args.overlap else train(records)
                finished = time.perf_counter()
                counters_after = engine_counters(runtime)
                steps.append({
                    "step_s": finished - step_started,
                    "weight_fetch_s": rolled["weight_fetch_s"],
                    "rollout_s": rolled["rollout_s"],
                    "generation_s": rolled["generation_s"],
                    "rollout_other_s": rolled["rollout_s"] - rolled["generation_s"],
                    "environment_s_summed_over_episodes": sum(
                        record.timings.environment_s for record in records),
                    **{key: trained[key] for key in ("train_s", "advantages_s", "batch_and_update_s",
                                                      "publish_s", "train_seq_len")},
                    "engine": {key: counters_after[key] - counters_before.get(key, 0)
                               for key in counters_after},
                    "policy_tokens": sum(sum(record.loss_mask) for record in records),
                    "sequence_tokens": sum(len(record.token_ids) for record in records),
                    "failed_episodes": sum(record.status != "ok" for record in records),
                    "reward_mean": float(np.mean([record.reward for record in records])),
                    "staleness_max": max(version - 1 - record.policy_version for record in records),
                    "loss_finite": bool(np.isfinite(trained["loss"])),
                })
                step_started = finished
        finally:
            counter.armed = False
            close = getattr(runtime, "close", None)
            if close is not None:
                close()
        params_changed = not np.array_equal(first_weight, np.array(jax.tree.leaves(state.params)[0]))
    finally:
        # Only the key this benchmark created.
        client.delete(weights_key(run_id))
        client.close()

    timed = steps[args.warmup:]

    def median(key: str) -> float:
        return round(statistics.median(step[key] for step in timed), 4)

    return {
        "step_s": median("step_s"),
        "step_s_mean": round(statistics.fmean(step["step_s"] for step in timed), 4),
        "step_s_min": round(min(step["step_s"] for step in timed), 4),
        "timed_steps": len(timed),
        "warmup_step_s": [round(step["step_s"], 3) for step in steps[:args.warmup]],
        "setup_compile_s": round(setup_compile_s, 3),
        # rollout_s = generation_s (engine busy) + rollout_other_s (environment,
        # asyncio, episode bookkeeping); train_s = advantages_s + batch_and_update_s.
        "phases_median_s": {key: median(key) for key in (
            "weight_fetch_s", "rollout_s", "generation_s", "rollout_other_s",
            "environment_s_summed_over_episodes", "train_s", "advantages_s",
            "batch_and_update_s", "publish_s")},
        "train_seq_len": max(step["train_seq_len"] for step in timed),
        "engine_per_step": {key: statistics.fmean(step["engine"][key] for step in timed)
                            for key in timed[0]["engine"]},
        "policy_tokens_per_step": statistics.fmean(step["policy_tokens"] for step in timed),
        "sequence_tokens_per_step": statistics.fmean(step["sequence_tokens"] for step in timed),
        "failed_episodes": sum(step["failed_episodes"] for step in timed),
        "reward_mean": round(statistics.fmean(step["reward_mean"] for step in timed), 3),
        "staleness_max": max(step["staleness_max"] for step in timed),
        "compiles_during_timed_steps": counter.count,
        "compile_s_during_timed_steps": round(counter.seconds, 3),
        "loss_finite": all(step["loss_finite"] for step in timed),
        "params_changed": params_changed,
    }


def crash_summary(stderr: str) -> str:
    """The fatal error and the frame it hit (faulthandler's dump), or the last lines of stderr."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    fatal = [line for line in lines if line.startswith("Fatal Python error")]
    if fatal:
        current = next((i for i, line in enumerate(lines) if line.startswith("Current thread")), None)
        frame = lines[current + 1] if current is not None and current + 1 < len(lines) else ""
        return f"{fatal[0]} at {frame}"
    return " | ".join(lines[-3:])


def run_tunix_path(args, path: str) -> tuple[dict[str, Any] | None, str | None]:
    """One Tunix path's JSON from tunix_reference.py, or None and why it could not be measured.

    Each path runs in its own process, and a crashed process is retried: on
    this CPU (jax 0.10.2, tunix 0.1.7) about one agentic run in four dies with
    SIGSEGV inside the jitted prefill of Tunix's sampler, which the agentic
    learner calls from many threads at once (with or without this
    benchmark's seeding).
    """
    command = [str(args.tunix_python), str(REPO_ROOT / "bench" / "tunix_reference.py"),
               "--paths", path, "--steps", str(args.steps), "--warmup", str(args.warmup),
               "--prompts", str(args.prompts), "--generations", str(args.generations),
               "--new-tokens", str(args.new_tokens), "--seed", str(args.seed)]
    errors = []
    for _ in range(args.tunix_attempts):
        try:
            completed = subprocess.run(command, capture_output=True, text=True,
                                       timeout=args.tunix_timeout_s, cwd=REPO_ROOT)
        except subprocess.TimeoutExpired:
            errors.append(f"did not finish in {args.tunix_timeout_s}s")
            continue
        lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
        if completed.returncode == 0 and lines:
            return json.loads(lines[-1]), "; ".join(errors) or None
        errors.append(f"exited {completed.returncode}: {crash_summary(completed.stderr or '')}")
    return None, "; ".join(errors)


def run_tunix(args) -> tuple[dict[str, Any] | None, list[str]]:
    """Tunix's plain and agentic results merged into one dict, and notes on any failure."""
    if not Path(args.tunix_python).exists():
        return None, [f"Tunix not measured: no Tunix environment at {args.tunix_python} "
                      "(python3 -m venv .bench-venv-tunix && "
                      ".bench-venv-tunix/bin/pip install google-tunix)."]
    merged: dict[str, Any] = {}
    notes = []
    for path in ("plain", "agentic"):
        result, error = run_tunix_path(args, path)
        if result is None:
            notes.append(f"Tunix {path} not measured: {error}.")
            continue
        if error:
            notes.append(f"Tunix {path} needed a retry: {error}.")
        merged.update(result)
    return merged or None, notes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="timed steps per path")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (compilation)")
    parser.add_argument("--prompts", type=int, default=4, help="tasks (GRPO groups) per step")
    parser.add_argument("--generations", type=int, default=4, help="episodes per task")
    parser.add_argument("--new-tokens", type=int, default=16, help="new tokens per policy turn")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--redis-url",
                        default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13"))
    parser.add_argument("--tunix-python", default=str(DEFAULT_TUNIX_PYTHON))
    parser.add_argument("--tunix-timeout-s", type=int, default=900)
    parser.add_argument("--tunix-attempts", type=int, default=3,
                        help="tries per Tunix path; its agentic learner sometimes segfaults")
    parser.add_argument("--skip-tunix", action="store_true", help="measure Tandem only")
    args = parser.parse_args()

    tunix, notes = (None, ["Tunix skipped (--skip-tunix)."]) if args.skip_tunix else run_tunix(args)
    # Both of Tandem's modes on the same code: generate-then-train, and the
    # overlapped pipeline it runs in production (rollouts one step ahead).
    args.overlap = False
    sequential = asyncio.run(tandem_agentic(args, CompileCounter()))
    args.overlap = True
    tandem = asyncio.run(tandem_agentic(args, CompileCounter()))
    tandem["sequential"] = sequential

    tandem_step = tandem["step_s"]
    sequential_ratio = round(sequential["step_s"] / tunix_plain, 2) if (
        tunix_plain := (tunix or {}).get("plain", {}).get("step_s")) else None
    tunix_agentic = (tunix or {}).get("agentic", {}).get("step_s")
    tunix_plain = (tunix or {}).get("plain", {}).get("step_s")
    ratio = round(tandem_step / tunix_plain, 2) if tunix_plain else None
    speedup = round(tunix_agentic / tandem_step, 2) if tunix_agentic else None
    notes.append(
        "step_s are medians of the timed steps, all measured in this run on "
        f"{jax.devices()[0].device_kind}. Both sides: vocabulary 259 (Tandem's byte tokenizer; "
        "its real path cannot run a 64-token vocabulary), no KL, temperature 1, at most "
        f"{args.new_tokens} new tokens per turn. Tunix's model calls get fresh sampling seeds "
        "(unseeded, its vanilla rollout samples every agentic episode of a group identically). "
        "tandem_agentic_step_s is Tandem's pipeline as it runs in production: the rollouts of "
        "step k+1 generate while step k trains (staleness 1, within the default bound). "
        f"Run strictly one after the other, Tandem's step took {sequential['step_s']} s "
        f"({sequential_ratio}x Tunix plain)."
    )
    if tandem["failed_episodes"]:
        notes.append(f"{tandem['failed_episodes']} Tandem episodes failed during the timed steps.")
    if ratio is not None:
        # The overlapped step's phases run concurrently; the sequential run's add up.
        phases, sequential_step = sequential["phases_median_s"], sequential["step_s"]
        weights = phases["weight_fetch_s"] + phases["publish_s"]
        verdict = "meets" if ratio <= PLAIN_STEP_TARGET_RATIO else "misses"
        notes.append(
            f"Tandem's agentic step {verdict} the {PLAIN_STEP_TARGET_RATIO}x-of-Tunix-plain target "
            f"({ratio}x). Tandem's sequential step: generation {phases['generation_s']} s for two "
            f"turns, train {phases['train_s']} s on sequences padded to "
            f"{sequential['train_seq_len']} tokens, weights {round(weights, 4)} s, rest "
            f"{round(sequential_step - phases['generation_s'] - phases['train_s'] - weights, 4)} s; "
            "Tunix's plain step generates one turn and trains on 32 + 16 tokens."
        )
    print(json.dumps({
        "tandem_agentic_step_s": tandem_step,
        "tunix_agentic_step_s": tunix_agentic,
        "tunix_plain_step_s": tunix_plain,
        # Per token of the policy's own output: Tandem's two-turn episodes generate about
        # twice the tokens of Tunix's one-turn plain step (whose budget, 4 x 4 x 16, is the
        # upper bound of what it generates, so this ratio is conservative for Tandem).
        "tandem_agentic_vs_tunix_plain_per_policy_token_ratio": round(
            (tandem_step / tandem["policy_tokens_per_step"])
            / (tunix_plain / (args.prompts * args.generations * args.new_tokens)), 2
        ) if tunix_plain else None,
        "tandem_agentic_sequential_step_s": sequential["step_s"],
        "tandem_agentic_sequential_vs_tunix_plain_ratio": sequential_ratio,
        "tandem_vs_tunix_agentic_speedup": speedup,
        "tandem_agentic_vs_tunix_plain_ratio": ratio,
        "within_target_of_tunix_plain": None if ratio is None else ratio <= PLAIN_STEP_TARGET_RATIO,
        "notes": " ".join(notes),
        "tandem": tandem,
        "tunix": tunix,
    }))


if __name__ == "__main__":
    main()
