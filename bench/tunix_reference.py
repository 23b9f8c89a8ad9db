"""Tunix's side of bench/vs_tunix.py: GRPO step times of Tunix's own learners on a tiny model.

Runs inside a virtual environment that has ``google-tunix`` (never Tandem's):

    python3 -m venv .bench-venv-tunix
    .bench-venv-tunix/bin/pip install google-tunix
    .bench-venv-tunix/bin/python bench/tunix_reference.py

It imports nothing from Tandem, so that Tunix and its pinned dependencies
stay out of Tandem's environment. It measures two paths on the same tiny
Llama-3-shaped model (Tunix's ``Llama3`` class, random init):

- ``plain``: ``tunix.rl.grpo.grpo_learner.GRPOLearner`` with the colocated
  vanilla rollout: each step samples all prompts x generations in one batch,
  scores them with a reward function, and applies one update.
- ``agentic``: ``tunix.rl.agentic.agentic_grpo_learner.GRPOLearner`` on a
  two-turn toy environment: each episode asks the policy, gets an environment
  reply, asks again; every model call generates for one conversation.

The tokenizer is byte-level with the same ids as Tandem's ``ByteTokenizer``
(bytes 0..255, pad 256, bos 257, eos 258), so both frameworks see the same
vocabulary and sequence lengths. A step is timed from the moment the learner
pulls one batch of prompts to the moment it pulls the next, after
``--warmup`` steps that include compilation. XLA compilations during the
timed steps are counted, so a step that recompiles shows up as such.

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import itertools
import json
import logging
import os
import statistics
import time
import warnings
from typing import Any

# A crash in a native library (seen once, as SIGSEGV) leaves Python tracebacks on stderr.
faulthandler.enable()
# Quiet before jax/absl are imported: Tunix logs at INFO on every step.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
warnings.filterwarnings("ignore")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from absl import logging as absl_logging  # noqa: E402
from flax import nnx  # noqa: E402

absl_logging.set_verbosity(absl_logging.ERROR)
logging.getLogger().setLevel(logging.ERROR)

from tunix.models.llama3 import model as llama3_lib  # noqa: E402
from tunix.rl import rl_cluster as rl_cluster_lib  # noqa: E402
from tunix.rl.agentic import agentic_grpo_learner  # noqa: E402
from tunix.rl.agentic.agents import model_agent  # noqa: E402
from tunix.rl.agentic.environments import base_environment  # noqa: E402
from tunix.rl.agentic.parser.chat_template_parser import parser as chat_parser_lib  # noqa: E402
from tunix.rl.grpo import grpo_learner  # noqa: E402
from tunix.rl.rollout import base_rollout  # noqa: E402

PAD_ID, BOS_ID, EOS_ID, VOCAB_SIZE = 256, 257, 258, 259


class ByteTokenizer:
    """Tandem's byte-level ids, in the duck-typed interface Tunix's TokenizerAdapter accepts."""

    def encode(self, text: str, **kwargs: Any) -> list[int]:
        del kwargs
        return list(text.encode("utf-8"))

    def decode(self, ids, **kwargs: Any) -> str:
        del kwargs
        return bytes(int(t) for t in ids if 0 <= int(t) < 256).decode("utf-8", errors="replace")

    def bos_id(self) -> int:
        return BOS_ID

    def eos_id(self) -> int:
        return EOS_ID

    def pad_id(self) -> int:
        return PAD_ID


class PlainChatParser(chat_parser_lib.BaseChatTemplateParser):
    """A minimal chat template made of plain bytes; the tiny model has no special tokens."""

    def _init_tokens(self) -> chat_parser_lib.TokenConfig:
        return chat_parser_lib.TokenConfig(
            system_token="S:", user_token="U:", assistant_token="A:", eot_token="\n"
        )

    def _init_generation_prompt(self) -> str:
        return self.tokens.assistant_token


def tiny_llama(args) -> llama3_lib.Llama3:
    config = llama3_lib.ModelConfig(
        num_layers=args.num_layers,
        vocab_size=VOCAB_SIZE,
        embed_dim=args.d_model,
        hidden_dim=args.mlp_dim,
        num_heads=args.num_heads,
        head_dim=args.d_model // args.num_heads,
        num_kv_heads=args.num_heads,
        rope_theta=10_000,
        norm_eps=1e-6,
    )
    return llama3_lib.Llama3(config, rngs=nnx.Rngs(args.seed))


def make_cluster(args, *, max_tokens: int, max_prompt_length: int, agentic: bool,
                 max_steps: int) -> rl_cluster_lib.RLCluster:
    # One mesh for actor and rollout: Tunix then shares one model between them
    # (no weight sync), its fastest single-host configuration.
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    rollout_config = base_rollout.RolloutConfig(
        max_tokens_to_generate=max_tokens,
        max_prompt_length=max_prompt_length,
        kv_cache_size=max_prompt_length + max_tokens + 16,
        temperature=1.0,
        return_logprobs=agentic,
    )
    cluster_config = rl_cluster_lib.ClusterConfig(
        role_to_mesh={
            rl_cluster_lib.Role.ACTOR: mesh,
            rl_cluster_lib.Role.REFERENCE: mesh,
            rl_cluster_lib.Role.ROLLOUT: mesh,
        },
        rollout_engine="vanilla",
        offload_to_cpu=False,
        training_config=rl_cluster_lib.RLTrainingConfig(
            actor_optimizer=optax.chain(optax.clip_by_global_norm(1.0), optax.adam(5e-4)),
            eval_every_n_steps=10**9,
            max_steps=max_steps,
            pbar_description=None,
        ),
        rollout_config=rollout_config,
    )
    cluster = rl_cluster_lib.RLCluster(
        actor=tiny_llama(args), reference=None, tokenizer=ByteTokenizer(),
        cluster_config=cluster_config,
    )
    seed_each_model_call(cluster.rollout, first_seed=args.seed)
    return cluster


def seed_each_model_call(rollout: base_rollout.BaseRollout, *, first_seed: int) -> None:
    """Give every model call its own sampling seed.

    The vanilla rollout seeds every call with the config's seed, PRNGKey(0)
    when unset. The agentic learner makes one call per episode, so all G
    episodes of a group would sample the same tokens and get advantage 0; a
    fresh seed per call gives the group real variation. The seed is a traced
    value, so this neither recompiles nor changes the work done.
    """
    seeds = itertools.count(first_seed)
    generate = rollout.generate

    def generate_with_fresh_seed(prompts, rollout_config, **kwargs):
        # next() on itertools.count is atomic under the GIL; calls come from many threads.
        return generate(prompts, dataclasses.replace(rollout_config, seed=next(seeds)), **kwargs)

    rollout.generate = generate_with_fresh_seed


class StepClock:
    """Yields batches and stamps the time each is pulled: the learner pulls batch k as step k starts."""

    def __init__(self, batches: list[dict[str, Any]]):
        self._batches = batches
        self.pulled_at: list[float] = []

    def __iter__(self):
        for batch in self._batches:
            self.pulled_at.append(time.perf_counter())
            yield batch

    def step_times(self, ended_at: float, *, steps: int) -> list[float]:
        boundaries = self.pulled_at[:steps] + [ended_at]
        return [later - earlier for earlier, later in itertools.pairwise(boundaries)]


class CompileCounter:
    """Counts XLA compilations (and their seconds) through jax.monitoring, while armed."""

    def __init__(self):
        self.armed = False
        self.count = 0
        self.seconds = 0.0
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, event: str, duration: float, **kwargs: Any) -> None:
        if self.armed and event == "/jax/core/compile/backend_compile_duration":
            self.count += 1
            self.seconds += duration


def summarize(step_times: list[float], warmup: int, counter: CompileCounter) -> dict[str, Any]:
    timed = step_times[warmup:]
    return {
        "step_s": round(statistics.median(timed), 4),
        "step_s_mean": round(statistics.fmean(timed), 4),
        "step_s_min": round(min(timed), 4),
        "timed_steps": len(timed),
        "warmup_step_s": [round(t, 3) for t in step_times[:warmup]],
        "compiles_during_timed_steps": counter.count,
        "compile_s_during_timed_steps": round(counter.seconds, 3),
    }


def first_parameter(cluster: rl_cluster_lib.RLCluster) -> np.ndarray:
    """A copy of one trained weight, to check that the steps really updated the model."""
    params = nnx.state(cluster.actor_trainer.model, nnx.Param)
    return np.array(jax.tree.leaves(params)[0])


def prompts_for(step: int, count: int) -> list[str]:
    return [f"Add {step % 7 + i} and {i + 2}." for i in range(count)]


def digit_reward(prompts, completions, **kwargs) -> list[float]:
    """1 when the completion contains a digit; a trivial, cheap reward."""
    del prompts, kwargs
    return [float(any(c.isdigit() for c in completion)) for completion in completions]


def bench_plain(args, counter: CompileCounter) -> dict[str, Any]:
    steps = args.warmup + args.steps
    cluster = make_cluster(args, max_tokens=args.new_tokens, max_prompt_length=32,
                           agentic=False, max_steps=steps)
    learner = grpo_learner.GRPOLearner(
        rl_cluster=cluster,
        algo_config=grpo_learner.GRPOConfig(num_generations=args.generations, num_iterations=1,
                                            beta=0.0, epsilon=0.2),
        reward_fns=digit_reward,
    )
    clock = StepClock([{"prompts": np.array(prompts_for(step, args.prompts))}
                       for step in range(steps + 2)])
    counter.count, counter.seconds = 0, 0.0

    def arm_after_warmup():
        # Armed from the pull of the first timed batch on.
        for index, batch in enumerate(clock):
            counter.armed = index >= args.warmup
            yield batch

    before = first_parameter(cluster)
    learner.train(arm_after_warmup())
    ended_at = time.perf_counter()
    counter.armed = False
    return {
        **summarize(clock.step_times(ended_at, steps=steps), args.warmup, counter),
        "params_changed": not np.array_equal(before, first_parameter(cluster)),
    }


class TwoTurnEnvironment(base_environment.BaseTaskEnv):
    """Asks a question, answers the policy's first turn with a hint, scores its second turn."""

    def __init__(self, single_example: dict[str, Any], **kwargs: Any):
        super().__init__(task=single_example, max_steps=2, **kwargs)

    def _initial_observation(self) -> dict[str, Any]:
        # The learner hands each episode a micro-batch of one prompt.
        prompt = self.task["prompts"]
        return {"prompts": prompt if isinstance(prompt, str) else str(prompt[0])}

    def _step_impl(self, action: Any) -> base_environment.EnvStepResult:
        text = getattr(action, "action", action) or ""
        if self.step_count == 1:
            return base_environment.EnvStepResult(
                observation="Try again, digits only:", reward=0.0, done=False, info={}
            )
        reward = float(any(c.isdigit() for c in str(text)))
        return base_environment.EnvStepResult(observation=None, reward=reward, done=True, info={})


class TurnCappedGRPOLearner(agentic_grpo_learner.GRPOLearner):
    """Tunix's agentic GRPO learner with each model call capped at ``turn_tokens`` new tokens.

    Tunix budgets new tokens per episode (``max_response_length``), not per
    turn; Tandem caps each turn. Capping here makes both generate at most the
    same tokens per turn, and keeps Tunix's sampler at one compiled shape.
    """

    turn_tokens = 16

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # Model calls and the tokens they generated, to show the work matches Tandem's.
        self.model_calls = 0
        self.generated_tokens = 0

    def _model_call(self, chat_lists, env=None, max_generation_steps=None):
        if max_generation_steps is None:
            max_generation_steps = self.turn_tokens
        output = super()._model_call(
            chat_lists, env, max_generation_steps=min(self.turn_tokens, max_generation_steps)
        )
        self.model_calls += 1
        self.generated_tokens += sum(len(tokens) for tokens in output.tokens)
        return output


def bench_agentic(args, counter: CompileCounter) -> dict[str, Any]:
    steps = args.warmup + args.steps
    # Room for two capped turns plus the environment's reply.
    max_response_length = 4 * args.new_tokens
    cluster = make_cluster(args, max_tokens=max_response_length, max_prompt_length=64,
                           agentic=True, max_steps=steps)
    TurnCappedGRPOLearner.turn_tokens = args.new_tokens
    learner = TurnCappedGRPOLearner(
        rl_cluster=cluster,
        algo_config=agentic_grpo_learner.GRPOConfig(
            num_generations=args.generations, num_iterations=1, beta=0.0, epsilon=0.2,
            max_response_length=max_response_length,
            max_concurrency=args.prompts * args.generations,
        ),
        chat_parser=PlainChatParser(ByteTokenizer()),
        agent_class=model_agent.ModelAgent,
        agent_kwargs={"system_prompt": ""},
        env_class=TwoTurnEnvironment,
    )
    clock = StepClock([{"prompts": np.array(prompts_for(step, args.prompts))}
                       for step in range(steps + 2)])
    counter.count, counter.seconds = 0, 0.0

    def arm_after_warmup():
        for index, batch in enumerate(clock):
            counter.armed = index >= args.warmup
            yield batch

    before = first_parameter(cluster)
    learner.train(arm_after_warmup())
    ended_at = time.perf_counter()
    counter.armed = False
    return {
        **summarize(clock.step_times(ended_at, steps=steps), args.warmup, counter),
        "model_calls_per_step": learner.model_calls / steps,
        "generated_tokens_per_step": learner.generated_tokens / steps,
        "params_changed": not np.array_equal(before, first_parameter(cluster)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", default="plain,agentic", help="comma-separated: plain, agentic")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per path")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (compilation)")
    parser.add_argument("--prompts", type=int, default=4, help="prompts (GRPO groups) per step")
    parser.add_argument("--generations", type=int, default=4, help="episodes per prompt")
    parser.add_argument("--new-tokens", type=int, default=16, help="new tokens per model call")
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--mlp-dim", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import tunix  # noqa: PLC0415 - only for its version

    counter = CompileCounter()
    output: dict[str, Any] = {
        "tunix_version": getattr(tunix, "__version__", None),
        "jax_version": jax.__version__,
        "device": jax.devices()[0].device_kind,
        "model": {"family": "tunix.models.llama3.Llama3", "num_layers": args.num_layers,
                  "d_model": args.d_model, "num_heads": args.num_heads, "mlp_dim": args.mlp_dim,
                  "vocab_size": VOCAB_SIZE},
        "prompts": args.prompts, "generations": args.generations, "new_tokens": args.new_tokens,
    }
    benches = {"plain": bench_plain, "agentic": bench_agentic}
    for path in args.paths.split(","):
        output[path] = benches[path](args, counter)
    print(json.dumps(output), flush=True)
    # The learners leave daemon threads (event loop, executors) behind; skip the
    # interpreter teardown, where they can crash the process after the result is out.
    os._exit(0)


if __name__ == "__main__":
    main()
