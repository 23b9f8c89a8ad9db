"""Held-out evaluation episodes: a slice of an evaluation, on exactly the policy version it names.

The trainer keeps the evaluated version in a hash of its own
(``evaluation_weights_key``), so an evaluation's runtime loads it and nothing
newer: every token of its episodes comes from that version, however far
training has moved on meanwhile. Tasks are the environment's held-out ones
(``sample_evaluation_task``), task ``i`` drawn from the same seed in every run.
Each episode goes to the run's evaluation stream, which the trainer never
trains from.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence

import redis

from environments import load_environment_class
from policy import Completion, RedisWeightSubscriber
from tandem.configs.rollout import SamplingConfig
from tandem.configs.run import RunConfig
from tandem.contracts import (
    EnvironmentSpec,
    EvaluationEpisode,
    EvaluationRequest,
    EvaluationSliceFailure,
    RunSpec,
    environment_paused_key,
    evaluation_stream,
    evaluation_weights_key,
    run_stop_key,
)
from tandem.runtime.redis_clients import durable_redis
from workers.agent import EpisodeLimits, run_episode
from workers.episode_loop import process_episode_loop
from workers.episode_slots import RunStoppedWaiting, episode_slots_for
from workers.policy import (
    BatchingPolicy,
    PolicyNotPublishedError,
    PolicyRuntime,
    close_stopped_idle_runtimes,
    inference_slots,
)
from workers.producer import (
    EnvironmentPausedError,
    RunNotReadyError,
    evaluation_task_seed,
    load_environment_secrets,
    load_run_spec,
)
from workers.run_logs import redact_run_logs_with
from workers.settings import ROLLOUT_TASK_TIME_LIMIT_S, task_concurrency

logger = logging.getLogger(__name__)

# Evaluation runtimes kept warm: (run, version) -> [runtime, tasks using it].
_runtimes: OrderedDict[tuple[int, int], list] = OrderedDict()
_runtimes_lock = threading.Lock()
_KEPT_IDLE_RUNTIMES = 2


def release_stopped_evaluation_runtimes(client: redis.Redis) -> list[tuple[int, int]]:
    """Close the idle evaluation runtimes of runs that stopped; returns their (run, version) keys."""
    return close_stopped_idle_runtimes(_runtimes, _runtimes_lock, client, run_of=lambda key: key[0])


class EvaluationSliceError(RuntimeError):
    """A slice failed past its episodes (its environment or engine would not start); secrets redacted."""


def evaluation_config(config: RunConfig, request: EvaluationRequest) -> RunConfig:
    """``config`` with the evaluation's sampling: temperature 0 is greedy (the most likely token).

    Its engine has as many KV-cache rows as the run's training engine: the same shapes,
    so it runs the programs that one compiled instead of compiling its own beside training
    (a minute of both cores for the nano model). Episodes beyond the rows wait for one.
    """
    greedy = request.temperature == 0
    sampling = config.sampling.model_copy(update={
        "temperature": 1.0 if greedy else request.temperature,
        "top_k": 1 if greedy else config.sampling.top_k,
        "top_p": 1.0 if greedy else config.sampling.top_p,
        "inference_slots": inference_slots(config, task_concurrency()),
    })
    return config.model_copy(update={"sampling": sampling})


@contextlib.contextmanager
def evaluation_runtime(redis_url: str, spec: RunSpec, request: EvaluationRequest) -> Iterator[PolicyRuntime]:
    """A runtime serving the request's version and no other, shared by the tasks of that version."""
    key = (spec.run_id, request.policy_version)
    with _runtimes_lock:
        entry = _runtimes.get(key)
        if entry is None:
            client = durable_redis(redis_url)
            subscriber = RedisWeightSubscriber(
                client, key_of=lambda run_id: evaluation_weights_key(run_id, request.policy_version))
            runtime = PolicyRuntime(run_id=spec.run_id, config=evaluation_config(spec.config, request),
                                    redis_client=client, subscriber=subscriber)
            entry = _runtimes[key] = [runtime, 0]
        entry[1] += 1
    runtime = entry[0]
    try:
        if runtime.params is None:
            version = runtime.pin()
            if version != request.policy_version:
                raise RunNotReadyError(f"run {spec.run_id}: version {version} kept for evaluation, "
                                       f"not {request.policy_version}")
            runtime.warm_up()
        yield runtime
    finally:
        with _runtimes_lock:
            entry[1] -= 1
            idle = [k for k, (_, users) in _runtimes.items() if users == 0]
            for stale in idle[:-_KEPT_IDLE_RUNTIMES] if len(idle) > _KEPT_IDLE_RUNTIMES else []:
                _runtimes.pop(stale)[0].close()


class SharedGreedyTurns:
    """The greedy turns of one evaluation slice, shared by its episodes.

    Greedy decoding gives one answer to one prompt, so the samples of a task
    make one request between them for as long as their conversations are the
    same (all of them, with an environment that answers alike), and requests of
    their own once they differ. A turn asked for while its twin is being
    generated waits for that one instead of queueing a second.
    """

    def __init__(self) -> None:
        self._turns: dict[tuple[int, ...], asyncio.Future[Completion]] = {}
        self.requests = 0  # turns generated; the others were shared

    def policy(self, policy: BatchingPolicy) -> _SharedGreedyPolicy:
        return _SharedGreedyPolicy(policy, self)

    async def generate(self, policy: BatchingPolicy, prompt: list[int], session_id,
                       extra_stop: Sequence[str] = ()) -> Completion:
        key = (tuple(prompt), tuple(extra_stop))
        turn = self._turns.get(key)
        if turn is None:
            turn = self._turns[key] = asyncio.get_running_loop().create_future()
            self.requests += 1
            try:
                turn.set_result(await policy.generate(prompt, session_id=session_id, extra_stop=extra_stop))
            except asyncio.CancelledError:
                del self._turns[key]
                turn.cancel()  # the slice is being cancelled: its twins with it
                raise
            except Exception as exc:
                del self._turns[key]  # the next twin asks again
                turn.set_exception(exc)
                turn.exception()  # retrieved: only the twins waiting on it see it
                raise
        completion = await asyncio.shield(turn)
        return dataclasses.replace(completion, token_ids=list(completion.token_ids),
                                   logprobs=list(completion.logprobs))


class _SharedGreedyPolicy:
    """A sample's policy whose turns come from :class:`SharedGreedyTurns`."""

    def __init__(self, policy: BatchingPolicy, turns: SharedGreedyTurns):
        self._policy = policy
        self._turns = turns

    @property
    def sampling(self) -> SamplingConfig:
        return self._policy.sampling

    async def generate(self, prompt: list[int], *, session_id=None, extra_stop: Sequence[str] = ()) -> Completion:
        return await self._turns.generate(self._policy, prompt, session_id, extra_stop)

    def end_session(self, session_id) -> None:
        self._policy.end_session(session_id)


async def _evaluate(*, redis_client, spec: RunSpec, environment: EnvironmentSpec, runtime: PolicyRuntime,
                    request: EvaluationRequest, secrets) -> int:
    """Run the slice's episodes on ``environment`` concurrently; returns how many went to the stream."""
    environment_class = load_environment_class(environment)
    environment_kwargs = secrets.constructor_kwargs(environment.settings)
    limits = EpisodeLimits.of_run(spec.config)
    slots = episode_slots_for(environment, redis_client)
    stream = evaluation_stream(spec.run_id)
    sent = 0
    shared = SharedGreedyTurns() if request.temperature == 0 else None

    async def run_stopped() -> bool:
        return bool(await redis_client.exists(run_stop_key(spec.run_id)))

    async def one_episode(task_index: int, task: dict, sample_index: int) -> None:
        nonlocal sent
        # A policy of its own per sample: its seeds do not depend on how episodes interleave.
        policy = BatchingPolicy(runtime, seed=(evaluation_task_seed(task_index) * 256 + sample_index) & 0x7FFFFFFF)
        try:
            async with slots.held(stopped=run_stopped):
                record = await run_episode(
                    run_id=spec.run_id, group_id=f"{spec.run_id}-evaluation{request.evaluation}-{task_index}"
                    + (f"-{environment.label}" if request.environment else ""),
                    group_size=request.samples_per_task, environment_name=environment.name,
                    environment=environment_class(**environment_kwargs), task=task,
                    policy=policy if shared is None else shared.policy(policy),
                    limits=limits, tokenizer=runtime.tokenizer, layout=runtime.prompt_layout,
                    redact=secrets.redact,
                )
        except RunStoppedWaiting:
            return
        finally:
            await policy.close()
        episode = EvaluationEpisode(evaluation=request.evaluation, policy_version=request.policy_version,
                                    task_index=task_index, sample_index=sample_index,
                                    environment=request.environment, record=record)
        await redis_client.xadd(stream, episode.to_stream_fields())
        sent += 1

    episodes = []
    task_source = environment_class(**environment_kwargs)
    for task_index in range(request.first_task, request.first_task + request.tasks):
        task = task_source.sample_evaluation_task(random.Random(evaluation_task_seed(task_index)))
        episodes += [one_episode(task_index, task, sample) for sample in range(request.samples_per_task)]
    await asyncio.gather(*episodes)
    return sent


def produce_evaluation(*, redis_url: str, request: EvaluationRequest) -> int:
    """Run one slice of an evaluation; returns the episodes streamed (fewer if the run stopped)."""
    client = durable_redis(redis_url)
    try:
        if client.exists(run_stop_key(request.run_id)):
            return 0
        spec = load_run_spec(client, request.run_id)
        if spec is None:
            raise RunNotReadyError(f"run {request.run_id} has no spec in Redis")
        environment = spec.evaluation_environment(request.environment)
        if environment is None:
            raise EvaluationSliceError(f"run {request.run_id} evaluates on no environment {request.environment!r}")
        paused = client.get(environment_paused_key(environment.version_id)) if environment.version_id else None
        if paused is not None:
            # Retried while the version may recover; then the slice fails with this reason.
            raise EnvironmentPausedError(
                f"run {request.run_id}: environment {environment.label} is unhealthy: {paused.decode()}")
        secrets = load_environment_secrets(client, spec, environment if request.environment else None)
        redact_run_logs_with(secrets)
        try:
            with evaluation_runtime(redis_url, spec, request) as runtime:
                return process_episode_loop.run(
                    _evaluate(redis_client=process_episode_loop.redis(redis_url), spec=spec, environment=environment,
                              runtime=runtime, request=request, secrets=secrets),
                    timeout_s=min(spec.config.rollout.timeout_s, ROLLOUT_TASK_TIME_LIMIT_S))
        except PolicyNotPublishedError as exc:
            # The kept version expired or was deleted (its evaluation was given up on): nothing to do.
            logger.warning("%s; evaluation %d skipped", exc, request.evaluation)
            return 0
        except (RunNotReadyError, EvaluationSliceError):
            raise
        except Exception as exc:
            # Its message goes to the trainer and the platform: never with a secret setting in it.
            raise EvaluationSliceError(secrets.redact(f"{type(exc).__name__}: {exc}")) from None
    finally:
        client.close()


def report_slice_failure(*, redis_url: str, request: EvaluationRequest, reason: str) -> None:
    """Tell the trainer that this slice's episodes will not come, and why (it reports the evaluation at once)."""
    failure = EvaluationSliceFailure(evaluation=request.evaluation, policy_version=request.policy_version,
                                     first_task=request.first_task, tasks=request.tasks,
                                     environment=request.environment, reason=reason[:2000])
    logger.error("run %s: evaluation %d tasks %d..%d given up: %s", request.run_id, request.evaluation,
                 request.first_task, request.first_task + request.tasks - 1, reason)
    client = durable_redis(redis_url)
    try:
        client.xadd(evaluation_stream(request.run_id), failure.to_stream_fields())
    finally:
        client.close()
