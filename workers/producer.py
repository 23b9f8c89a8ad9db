"""Producing episode groups for a run and streaming each trajectory as it ends."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import redis
import redis.asyncio as aioredis

from environments import EVALUATION_SEED_BASE, load_environment_class
from policy import WeightsNotVisibleError
from tandem.contracts import (
    EnvironmentSpec,
    ProducerFault,
    RunSpec,
    environment_paused_key,
    producer_fault_key,
    run_environment_secrets_key,
    run_evaluation_secrets_key,
    run_spec_key,
    run_stop_key,
    trajectory_stream,
)
from tandem.runtime.redis_clients import durable_async_redis, durable_redis
from tandem.runtime.secrets_at_rest import SecretsCipher, SecretsKeyError, environment_secrets_open
from workers.activity import WORKER_NAME, process_activity, report_activity
from workers.agent import EpisodeLimits, run_episode
from workers.episode_loop import process_episode_loop
from workers.episode_slots import RunStoppedWaiting, episode_slots_for
from workers.policy import (
    BatchingPolicy,
    PolicyNotPublishedError,
    PolicyRuntime,
    close_stopped_idle_runtimes,
)
from workers.run_logs import redact_run_logs_with
from workers.secret_settings import SecretSettings
from workers.settings import ROLLOUT_TASK_TIME_LIMIT_S

logger = logging.getLogger(__name__)

# Runtimes stay warm across tasks: rebuilding the sampler would recompile it. Run -> [runtime, task
# threads using it]: one in use is never closed.
_runtimes: dict[int, list] = {}
# Task threads (Celery's threads pool) share the runtimes; creating one is guarded.
_runtimes_lock = threading.Lock()
# Runtimes kept warm for runs that have not stopped; a worker rarely serves more at once.
_KEPT_RUNTIMES = 2


class RunNotReadyError(RuntimeError):
    """The run's spec or first weights are not in Redis yet; the task should retry."""


class EnvironmentPausedError(RunNotReadyError):
    """The run's environment version failed a health check; no episode starts until it passes one."""


class SecretSettingsUndecryptableError(RuntimeError):
    """This worker's TANDEM_SECRETS_KEY does not decrypt the run's secret settings; not retried (a ProducerFault)."""


class RolloutTaskTimeLimitError(RuntimeError):
    """A rollout task ran past its time limit; its unfinished episodes were cancelled."""


@dataclass(frozen=True)
class ProductionSummary:
    run_id: int
    episodes: int
    failed: int
    # True if the run had stopped before the task began, or stopped while episodes waited for
    # their environment's slots (those never started and are not in ``episodes``).
    skipped_stopped: bool
    wall_s: float
    generation_s: float


def load_run_spec(client: redis.Redis, run_id: int) -> RunSpec | None:
    raw = client.get(run_spec_key(run_id))
    return None if raw is None else RunSpec.model_validate_json(raw)


def load_environment_secrets(client: redis.Redis, spec: RunSpec,
                             evaluation_environment: EnvironmentSpec | None = None) -> SecretSettings:
    """The secret settings of ``spec``'s environment (or of ``evaluation_environment``, one of the others
    it evaluates on), which the platform wrote when the run was claimed.

    Raises RunNotReadyError while they are not there (the claim's Redis write is still
    on its way, or failed and is logged by the platform): an environment built without
    its API key would fail every episode. Raises SecretSettingsUndecryptableError, having
    reported a ProducerFault (the trainer fails the run with its reason), if this worker's
    TANDEM_SECRETS_KEY is missing or does not decrypt them: every try would fail alike.
    """
    environment = evaluation_environment or spec.environment
    names = set(environment.secret_setting_names)
    if not names:
        return SecretSettings()
    if evaluation_environment is None:
        raw = client.get(run_environment_secrets_key(spec.run_id))
    else:
        raw = client.hget(run_evaluation_secrets_key(spec.run_id), str(environment.version_id))
    try:
        secrets = None if raw is None else environment_secrets_open(raw, SecretsCipher.from_environment())
    except SecretsKeyError as exc:
        reason = (f"run {spec.run_id}: producer {WORKER_NAME} cannot decrypt the secret settings of "
                  f"{environment.label}: {exc}")
        report_producer_fault(client, spec.run_id, ProducerFault(
            kind="secrets_undecryptable", reason=reason, producer=WORKER_NAME))
        raise SecretSettingsUndecryptableError(reason) from None
    if secrets is None or secrets.version_id != environment.version_id or set(secrets.settings) != names:
        raise RunNotReadyError(
            f"run {spec.run_id}: the secret settings of {environment.label} "
            f"({', '.join(sorted(names))}) are not in Redis"
        )
    return SecretSettings(secrets.revealed())


@contextlib.contextmanager
def runtime_for(redis_url: str, spec: RunSpec) -> Iterator[PolicyRuntime]:
    """The warm runtime of ``spec``'s run, shared by every task thread of this worker process, held
    while the block runs: nothing closes it meanwhile."""
    with _runtimes_lock:
        entry = _runtimes.get(spec.run_id)
        if entry is None:
            entry = _runtimes[spec.run_id] = [PolicyRuntime(run_id=spec.run_id, config=spec.config,
                                                            redis_client=durable_redis(redis_url)), 0]
            # The oldest idle ones go beyond the kept few: each holds weights and a KV cache.
            idle = [run_id for run_id, (_, users) in _runtimes.items() if users == 0 and run_id != spec.run_id]
            for oldest in idle[:max(0, len(_runtimes) - _KEPT_RUNTIMES)]:
                _runtimes.pop(oldest)[0].close()
        entry[1] += 1
    try:
        yield entry[0]
    finally:
        with _runtimes_lock:
            entry[1] -= 1


def release_stopped_runtimes(client: redis.Redis) -> list[int]:
    """Close the runtimes of runs that stopped (their stop key is set) and that no task uses; returns their runs.

    The engine's weights, KV cache, logits and thread go as soon as the run ends, instead of
    staying until two newer runs push them out: a worker that served a large model would otherwise
    hold its memory for as long as it idles. A run resumed later builds its runtime again.
    """
    released = close_stopped_idle_runtimes(_runtimes, _runtimes_lock, client, run_of=lambda run_id: run_id)
    for run_id in released:
        logger.info("run %s stopped: its inference engine on this worker is released", run_id)
    return released


def held_runtime_runs() -> list[int]:
    """The runs whose runtime this process holds (warm or in use)."""
    with _runtimes_lock:
        return sorted(_runtimes)


def group_task_seed(run_seed: int, group_index: int) -> int:
    """The seed a training group's task is drawn with: below EVALUATION_SEED_BASE, like every training seed."""
    return (run_seed * 1_000_003 + group_index) % EVALUATION_SEED_BASE


def evaluation_task_seed(task_index: int) -> int:
    """The seed held-out task ``task_index`` is drawn with, the same in every run: evaluations compare."""
    return EVALUATION_SEED_BASE + task_index % EVALUATION_SEED_BASE


async def produce_groups(*, redis_url: str, spec: RunSpec, runtime: PolicyRuntime,
                         first_group_index: int, num_groups: int,
                         redis_client: aioredis.Redis | None = None,
                         secrets: SecretSettings | None = None) -> ProductionSummary:
    """Run ``num_groups`` GRPO groups concurrently; XADD every trajectory as soon as it ends.

    ``redis_client``: a client of the running loop to stream with (the episode
    loop's); by default one of this call's own, closed at the end. ``secrets``: the
    environment's secret settings (load_environment_secrets), merged into its settings.

    An environment with ``max_concurrent_episodes`` runs no more episodes at once, across
    every producer (workers/episode_slots.py): an episode waits for a slot before its
    reset, and holds it until it has ended; the wait is its ``timings.slot_wait_s``.
    Episodes still waiting when the run stops never start.
    """
    config = runtime.config
    secrets = secrets or SecretSettings()
    environment_class = load_environment_class(spec.environment)
    environment_kwargs = secrets.constructor_kwargs(spec.environment.settings)
    limits = EpisodeLimits.of_run(config)
    policy = BatchingPolicy(runtime, seed=group_task_seed(config.seed, first_group_index))
    stream = trajectory_stream(spec.run_id)
    client = redis_client if redis_client is not None else durable_async_redis(redis_url)
    slots = episode_slots_for(spec.environment, client)
    started = time.perf_counter()
    failed = not_started = 0

    async def run_stopped() -> bool:
        return bool(await client.exists(run_stop_key(spec.run_id)))

    async def one_episode(group_index: int, task: dict) -> None:
        nonlocal failed, not_started
        try:
            async with slots.held(stopped=run_stopped) as slot:
                environment = environment_class(**environment_kwargs)
                record = await run_episode(
                    run_id=spec.run_id,
                    group_id=f"{spec.run_id}-{group_index}",
                    group_size=config.rollout.group_size,
                    environment_name=spec.environment.name,
                    environment=environment,
                    task=task,
                    policy=policy,
                    limits=limits,
                    tokenizer=runtime.tokenizer,
                    layout=runtime.prompt_layout,
                    # Failure reasons are shown to the project's viewers; an environment's error may quote its key.
                    redact=secrets.redact,
                )
        except RunStoppedWaiting:
            not_started += 1
            return
        if slot.wait_s:
            record = record.model_copy(update={
                "timings": record.timings.model_copy(update={"slot_wait_s": round(slot.wait_s, 6)})})
        if record.status == "failed":
            failed += 1
            logger.warning("run %s episode failed: %s", spec.run_id, record.failure_reason)
        began = time.perf_counter()
        await client.xadd(stream, record.to_stream_fields())
        process_activity.episode_finished(run_id=spec.run_id, timings=record.timings,
                                          stream_put_s=time.perf_counter() - began)

    try:
        episodes = []
        for group_index in range(first_group_index, first_group_index + num_groups):
            task_environment = environment_class(**environment_kwargs)
            task = task_environment.sample_task(random.Random(group_task_seed(config.seed, group_index)))
            episodes += [one_episode(group_index, task) for _ in range(config.rollout.group_size)]
        await asyncio.gather(*episodes)
    finally:
        await policy.close()
        if redis_client is None:
            await client.aclose()
    return ProductionSummary(
        run_id=spec.run_id,
        episodes=num_groups * config.rollout.group_size - not_started,
        failed=failed,
        skipped_stopped=not_started > 0,
        wall_s=time.perf_counter() - started,
        generation_s=policy.generation_s,
    )


def report_producer_fault(client: redis.Redis, run_id: int, fault: ProducerFault) -> None:
    """Record why producers cannot serve ``run_id``; the first producer to find a fault names it."""
    logger.error("run %s cannot be served by producer %s: %s", run_id, fault.producer, fault.reason)
    client.set(producer_fault_key(run_id), fault.model_dump_json(), nx=True)


def produce(*, redis_url: str, run_id: int, first_group_index: int, num_groups: int) -> ProductionSummary:
    """Synchronous entry point of a rollout task."""
    client = durable_redis(redis_url)
    try:
        if client.exists(run_stop_key(run_id)):
            return ProductionSummary(run_id, 0, 0, True, 0.0, 0.0)
        spec = load_run_spec(client, run_id)
        if spec is None:
            raise RunNotReadyError(f"run {run_id} has no spec in Redis")
        if spec.environment.version_id is not None:
            reason = client.get(environment_paused_key(spec.environment.version_id))
            if reason is not None:
                raise EnvironmentPausedError(
                    f"run {run_id}: environment {spec.environment.label} is unhealthy: {reason.decode()}"
                )
        secrets = load_environment_secrets(client, spec)
        # The run's log is shown to its viewers; an environment's error may quote its key.
        redact_run_logs_with(secrets)
        summary = None
        process_activity.task_started(run_id=run_id)
        try:
            report_activity(client, run_id)
            began = time.perf_counter()
            with runtime_for(redis_url, spec) as runtime:
                built = time.perf_counter()
                try:
                    runtime.refresh_weights(force=True)
                except PolicyNotPublishedError as exc:
                    raise RunNotReadyError(str(exc)) from exc
                except WeightsNotVisibleError as exc:
                    # Every try, here or on any host without that storage, fails alike: the trainer
                    # fails the run with this reason rather than wait for episodes that cannot come.
                    report_producer_fault(client, run_id, ProducerFault(
                        kind="weights_not_visible", reason=str(exc), producer=WORKER_NAME))
                    raise
                fetched = time.perf_counter()
                runtime.warm_up()
                # Where a task's seconds before its first episode went (a first run of a model on a
                # host compiles; later ones should take seconds).
                logger.info("run %s: ready for episodes %.1f s after the task began (runtime %.1f s, weights "
                            "%.1f s, warm-up %.1f s)", run_id, time.perf_counter() - began, built - began,
                            fetched - built, time.perf_counter() - fetched)
                time_limit_s = min(runtime.config.rollout.timeout_s, ROLLOUT_TASK_TIME_LIMIT_S)
                try:
                    summary = process_episode_loop.run(produce_groups(
                        redis_url=redis_url, spec=spec, runtime=runtime,
                        first_group_index=first_group_index, num_groups=num_groups,
                        redis_client=process_episode_loop.redis(redis_url), secrets=secrets,
                    ), timeout_s=time_limit_s)
                except TimeoutError as exc:
                    # Not retried: the trainer counts the groups lost after rollout.timeout_s and asks again.
                    raise RolloutTaskTimeLimitError(
                        f"run {run_id}: groups {first_group_index}..{first_group_index + num_groups - 1} did not "
                        f"finish within {time_limit_s:g}s; their episodes were cancelled") from exc
                return summary
        finally:
            process_activity.task_finished(run_id=run_id, episodes=summary.episodes if summary else 0,
                                           failed=summary.failed if summary else 0)
            report_activity(client, run_id)
    finally:
        client.close()
