"""The imported model's baseline, as a registration probe runs it: a few episodes before any training.

A model that never calls the environment's tools gives GRPO nothing to learn from (every reward
the same); the registration says so before a run is spent finding out. The episodes are an
evaluation's first held-out tasks (``evaluation_task_seed``), played as producers play them
(``run_episode``, the model's chat template and tool-call format), one environment instance each,
no more at once than the environment allows (its ``max_concurrent_episodes``). The weights are the
model directory's own, as a run starts from them (version 0); nothing is published or streamed.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from flax import nnx

from environments import Environment
from policy import create_model, load_tokenizer, split_model
from tandem.allowlists.model_paths import check_model_config_paths
from tandem.configs.model import ModelConfig
from tandem.configs.rollout import RolloutConfig, SamplingConfig
from tandem.configs.run import RunConfig
from tandem.contracts import (
    ProbeBaseline,
    ProbeBaselineRequest,
    tool_use_intervals,
    tool_use_metrics,
)
from workers.agent import EpisodeLimits, run_episode
from workers.policy import BatchingPolicy, PolicyRuntime
from workers.producer import evaluation_task_seed

# The run id the baseline's episodes carry: no run's (the platform's ids start at 1).
BASELINE_RUN_ID = 0


class ImportedWeights:
    """A weight subscriber that serves the model directory's own weights as version 0 (what a run
    starts from); the runtime fetches them once, since no newer version ever comes."""

    def __init__(self, model: ModelConfig, *, vocab_size: int):
        self._model = model
        self._vocab_size = vocab_size

    def latest_version(self, run_id: int) -> int | None:
        return 0

    def fetch(self, run_id: int, like: nnx.State) -> tuple[int, nnx.State] | None:
        return 0, split_model(create_model(self._model, vocab_size=self._vocab_size, rngs=None))[1]


def baseline_config(request: ProbeBaselineRequest) -> RunConfig:
    """The run config the baseline's engine and episodes hold to: the request's model and limits."""
    greedy = request.temperature == 0
    return RunConfig(
        model=ModelConfig(hf_checkpoint=request.model, tokenizer=request.model, max_seq_len=request.max_seq_len),
        sampling=SamplingConfig(max_new_tokens=request.max_new_tokens,
                                temperature=1.0 if greedy else request.temperature, top_k=1 if greedy else 0,
                                inference_slots=request.episodes),
        rollout=RolloutConfig(max_turns=request.max_turns),
    )


def run_baseline(request: ProbeBaselineRequest, *, make_environment: Callable[[], Environment],
                 environment_name: str, concurrency: int | None,
                 redact: Callable[[str], str] | None = None) -> ProbeBaseline:
    """Play ``request.episodes`` held-out episodes of the imported model; what they showed.

    ``make_environment`` builds a fresh instance per episode (and one to draw the tasks from);
    ``concurrency`` bounds the episodes at once (None: all of them). Raises what loading the model
    or its engine raises (ModelPathRefused for a directory outside the model roots); an episode's
    own fault ends that episode as failed, as in a run.
    """
    started = time.perf_counter()
    config = baseline_config(request)
    # Before a file of it is read: only directories under the operator's model roots.
    check_model_config_paths(config.model)
    vocab_size = load_tokenizer(config.model.tokenizer).vocab_size
    runtime = PolicyRuntime(run_id=BASELINE_RUN_ID, config=config, redis_client=None,
                            subscriber=ImportedWeights(config.model, vocab_size=vocab_size))
    try:
        runtime.refresh_weights(force=True)
        records = asyncio.run(_episodes(request, runtime, config, make_environment=make_environment,
                                        environment_name=environment_name,
                                        concurrency=concurrency or request.episodes, redact=redact))
    finally:
        runtime.close()
    # run_episode ends every episode (a fault fails it), so there is one record per task.
    tools = tool_use_metrics(records) if any(record.offered_tools for record in records) else {}
    return ProbeBaseline(
        model=request.model, episodes=len(records), statuses=dict(Counter(record.status for record in records)),
        mean_reward=statistics.fmean(record.reward for record in records),
        tool_use={name: round(value, 6) for name, value in tools.items()},
        tool_use_ci95={name: (round(low, 6), round(high, 6))
                       for name, (low, high) in tool_use_intervals(records, tools).items()},
        wall_s=round(time.perf_counter() - started, 3),
    )


async def _episodes(request: ProbeBaselineRequest, runtime: PolicyRuntime, config: RunConfig, *,
                    make_environment: Callable[[], Environment], environment_name: str, concurrency: int,
                    redact: Callable[[str], str] | None) -> list[Any]:
    limits = EpisodeLimits.of_run(config)
    task_source = make_environment()
    tasks = [task_source.sample_evaluation_task(random.Random(evaluation_task_seed(index)))
             for index in range(request.episodes)]
    gate = asyncio.Semaphore(concurrency)

    async def one(index: int, task: dict[str, Any]):
        policy = BatchingPolicy(runtime, seed=evaluation_task_seed(index))
        try:
            async with gate:
                return await run_episode(
                    run_id=BASELINE_RUN_ID, group_id=f"probe-baseline-{index}", group_size=1,
                    environment_name=environment_name, environment=make_environment(), task=task,
                    policy=policy, limits=limits, tokenizer=runtime.tokenizer, layout=runtime.prompt_layout,
                    redact=redact)
        finally:
            await policy.close()

    return list(await asyncio.gather(*(one(index, task) for index, task in enumerate(tasks))))
