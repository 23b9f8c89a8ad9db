"""The policy as producers see it: one inference engine per run, shared by all episodes.

:class:`PolicyRuntime` owns the run's :class:`~policy.InferenceEngine`
and keeps it (compiled functions, KV cache, background thread) warm across
Celery tasks of the worker process. The engine batches every concurrent
episode continuously: a turn joins the running batch at the next decode chunk
and returns as soon as it is done, and an episode keeps its KV prefix between
turns (its session), so only the environment's new tokens are prefilled.

New weights are polled from Redis between decode chunks (at most every
``weight_poll_s``) and swapped in without draining in-flight turns; each
completion reports the version of its first token.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, MutableMapping, Sequence
from typing import TypeVar

import redis
from flax import nnx

from policy import (
    Completion,
    InferenceEngine,
    RedisWeightSubscriber,
    SamplingParams,
    Transformer,
    WeightSubscriber,
    enable_compilation_cache,
    load_tokenizer,
    policy_config,
    prompt_layout,
    split_model,
)
from tandem.allowlists.model_paths import check_model_config_paths
from tandem.configs.quotas import slot_count
from tandem.configs.rollout import SamplingConfig
from tandem.configs.run import RunConfig
from tandem.contracts import run_stop_key
from workers.settings import task_concurrency

logger = logging.getLogger(__name__)


class PolicyNotPublishedError(RuntimeError):
    """The trainer has not published any weights for this run yet."""



def inference_slots(config: RunConfig, task_concurrency: int = 1) -> int:
    """KV-cache rows of a run's engine: by default, every episode the process's task threads run at once.

    The task threads of a worker share one engine. With fewer rows than
    episodes in flight, turns queue for a row and idle episodes lose their
    cached prefix, so generation runs in small batches exactly when many
    episodes wait on their environments.
    """
    rollout = config.rollout
    return slot_count(configured=config.sampling.inference_slots, groups_per_task=rollout.groups_per_task,
                      group_size=rollout.group_size, task_concurrency=task_concurrency)


class PolicyRuntime:
    """Inference engine plus current weights of one run, kept warm across Celery tasks."""

    def __init__(self, *, run_id: int, config: RunConfig, redis_client: redis.Redis | None,
                 weight_poll_s: float = 0.25, subscriber: WeightSubscriber | None = None):
        if subscriber is None and redis_client is None:
            raise ValueError("a policy runtime needs a subscriber or the Redis its weights are published to")
        self.run_id = run_id
        self.config = config
        # Only model directories under the operator's roots, checked here where links resolve.
        check_model_config_paths(config.model)
        enable_compilation_cache()
        self.tokenizer = load_tokenizer(config.model.tokenizer)
        # How episodes are rendered: the model's chat template, or the byte layout.
        self.prompt_layout = prompt_layout(config.model, self.tokenizer)
        # The trainer builds its policy from the same function: structures must match.
        model_config = policy_config(config.model, vocab_size=self.tokenizer.vocab_size)
        abstract = nnx.eval_shape(lambda: Transformer(model_config, rngs=nnx.Rngs(0)))
        self._graphdef, self._params_like = split_model(abstract)
        self.engine = InferenceEngine(
            self._graphdef,
            config=model_config,
            # A turn ends at the template's end-of-turn token (the tokenizer's EOS, or Gemma's <end_of_turn>).
            eos_id=self.prompt_layout.end_of_turn_id,
            pad_id=self.tokenizer.pad_id if self.tokenizer.pad_id is not None else self.tokenizer.eos_id,
            num_slots=inference_slots(config, task_concurrency()),
            chunk_size=config.sampling.decode_chunk_tokens,
            refill_hold_fraction=config.sampling.refill_hold_fraction,
            detokenize=self.tokenizer.decode,
            # Runs in the engine thread between chunks, so weights never change mid-chunk.
            between_chunks=self.refresh_weights,
        )
        self._subscriber: WeightSubscriber = subscriber or RedisWeightSubscriber(redis_client)
        self._weight_poll_s = weight_poll_s
        self._lock = threading.Lock()
        self.params = None
        self.policy_version = -1
        self._last_poll = 0.0
        self._warm_lock = threading.Lock()
        self._warm = False

    def refresh_weights(self, *, force: bool = False) -> int:
        """Load the newest published weights into the engine if there are newer ones.

        Polls Redis at most every ``weight_poll_s`` unless ``force``; returns
        the version in use. Raises PolicyNotPublishedError before the first
        publication.
        """
        with self._lock:
            now = time.monotonic()
            if not force and now - self._last_poll < self._weight_poll_s and self.params is not None:
                return self.policy_version
            self._last_poll = now
            latest = self._subscriber.latest_version(self.run_id)
            if latest is not None and latest > self.policy_version:
                fetched = self._subscriber.fetch(self.run_id, self._params_like)
                if fetched is not None:
                    self.policy_version, self.params = fetched
                    self.engine.set_params(self.params, self.policy_version)
            if self.params is None:
                raise PolicyNotPublishedError(f"run {self.run_id} has no published policy yet")
            return self.policy_version

    def pin(self) -> int:
        """Load the subscriber's version whatever this runtime holds, newer or older; returns it.

        For an evaluation's runtime, whose subscriber reads one kept version
        (``evaluation_weights_key``): between chunks it finds nothing newer, so every
        token is generated by that version.

        Raises PolicyNotPublishedError when the version is not there (any more).
        """
        with self._lock:
            fetched = self._subscriber.fetch(self.run_id, self._params_like)
            if fetched is None:
                raise PolicyNotPublishedError(f"run {self.run_id}: the evaluated version is not published")
            self.policy_version, self.params = fetched
            self.engine.set_params(self.params, self.policy_version)
            self._last_poll = time.monotonic()
            return self.policy_version

    def warm_up(self) -> None:
        """Compile every prefill and decode bucket of the engine, once, before its first episode.

        A bucket compiled on first use stalls every episode of the process
        for the compile (about half a second each on two CPU cores, far more
        for large models), and the first steps of a run would pay for all
        of them. Engines of the same model share their compiled functions, so
        the runtime of a later run on the same model only runs each bucket
        once. Needs the first weights (:meth:`refresh_weights`). A failure is
        logged and leaves compiling to first use.
        """
        with self._warm_lock:
            if self._warm:
                return
            self._warm = True  # tried once: a failure falls back to compiling on first use
            try:
                self.engine.warmup()
            except Exception:  # noqa: BLE001 - e.g. the largest bucket does not fit the device
                logger.exception("run %s: warming up the inference engine failed; buckets compile on first use",
                                 self.run_id)

    def close(self) -> None:
        """Stop the engine's thread and cancel what it still holds."""
        self.engine.close()


RuntimeKey = TypeVar("RuntimeKey", bound=Hashable)


def close_stopped_idle_runtimes(runtimes: MutableMapping[RuntimeKey, list], lock: threading.Lock,
                                client: redis.Redis, *, run_of: Callable[[RuntimeKey], int]) -> list[RuntimeKey]:
    """Close the ``[runtime, tasks using it]`` entries of ``runtimes`` that no task uses and whose run
    stopped (its stop key is set); returns their keys. The stop keys are read outside ``lock``: an
    entry a task took meanwhile is kept."""
    with lock:
        idle = [key for key, (_, users) in runtimes.items() if users == 0]
    stopped = {key for key in idle if client.exists(run_stop_key(run_of(key)))}
    with lock:
        released = [key for key in stopped if key in runtimes and runtimes[key][1] == 0]
        for key in released:
            runtimes.pop(key)[0].close()
    return sorted(released)


class BatchingPolicy:
    """One rollout task's handle on the run's engine: sampling settings, seeds, sessions.

    The batching itself happens in the engine, across every episode of the
    worker process. Each episode passes its own ``session_id`` and ends it
    with :meth:`end_session`; :meth:`close` ends whatever is left.
    ``generation_s`` is the time the engine spent decoding while this policy
    was open.
    """

    def __init__(self, runtime: PolicyRuntime, *, seed: int):
        self._runtime = runtime
        self._seed = seed
        self._requests = 0
        self._sessions: set[Hashable] = set()
        self._busy_at_open = runtime.engine.stats.busy_s
        self._generation_s: float | None = None

    @property
    def generation_s(self) -> float:
        if self._generation_s is not None:
            return self._generation_s
        return self._runtime.engine.stats.busy_s - self._busy_at_open

    @property
    def sampling(self) -> SamplingConfig:
        """The run's sampling settings, which every turn is sampled with."""
        return self._runtime.config.sampling

    async def generate(self, prompt: list[int], *, session_id: Hashable | None = None,
                       extra_stop: Sequence[str] = ()) -> Completion:
        """One policy turn after ``prompt``, reusing the session's cached prefix; ``extra_stop`` ends it at
        strings of the caller's besides the run's own."""
        sampling = self._runtime.config.sampling
        self._requests += 1
        if session_id is not None:
            self._sessions.add(session_id)
        return await self._runtime.engine.generate(
            session_id,
            prompt,
            SamplingParams(
                max_new_tokens=sampling.max_new_tokens,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                stop=tuple(dict.fromkeys([*sampling.stop_strings, *extra_stop])),
                seed=hash((self._seed, self._requests)),
            ),
        )

    def end_session(self, session_id: Hashable) -> None:
        """Free the session's KV-cache slot; its episode will not generate again."""
        self._sessions.discard(session_id)
        self._runtime.engine.end_session(session_id)

    async def close(self) -> None:
        for session_id in list(self._sessions):
            self.end_session(session_id)
        self._generation_s = self.generation_s
