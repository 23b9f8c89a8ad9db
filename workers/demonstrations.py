"""An SFT step's demonstrations, made where environment code runs, for the trainer to render.

The trainer never imports a run's environment (SECURITY.md): it asks for a
step's demonstrations by task name, and this producer builds the environment
as it does for episodes (``environments.load_environment_class``, behind the
operator's ``TANDEM_ENVIRONMENT_MODULES``, with the version's secret settings,
which the trainer is never sent), asks it for them, writes each as
chat messages in the run's tool-call format, and appends the
:class:`DemonstrationBatch` to the run's demonstration stream. Whatever goes
wrong on the way (a refused or broken registration, ``demonstrations()``
raising, a malformed demonstration) is answered as a batch with an error,
which the trainer fails the run with: it never waits on an answer that will
not come.
"""

from __future__ import annotations

import inspect
import logging
import random
from collections.abc import Awaitable
from typing import get_args

from environments import (
    Environment,
    EnvironmentLoadError,
    ToolCallFormat,
    demonstration_messages,
    load_environment_class,
)
from tandem.contracts import (
    DEMONSTRATION_ERROR_CHARS,
    DemonstrationBatch,
    DemonstrationMessage,
    RunSpec,
    demonstration_stream,
    run_spec_key,
    run_stop_key,
)
from tandem.runtime.redis_clients import durable_redis
from workers.episode_loop import process_episode_loop
from workers.producer import SecretSettingsUndecryptableError, load_environment_secrets
from workers.run_logs import redact_run_logs_with
from workers.secret_settings import SecretSettings

logger = logging.getLogger(__name__)

# Answers a stream holds at most: the trainer asks one step ahead and deletes what it read,
# so more than a few means no trainer is reading (the run ended); its keys expire with it.
_STREAM_MAXLEN = 32


def demonstration_batch(spec: RunSpec, *, step: int, count: int, seed: int, tool_call_format: str,
                        request_id: str, secrets: SecretSettings | None = None) -> DemonstrationBatch:
    """The demonstrations of SFT ``step`` of ``spec``'s run, or a batch saying why there are none.

    ``seed`` seeds the environment's RNG, so a resumed run's step gets the same
    demonstrations. ``secrets``: the environment's secret settings, merged into its
    settings and kept out of the error, which the run's viewers read. Never raises
    for the environment's faults: they are the batch's ``error``.
    """
    secrets = secrets or SecretSettings()

    def failed(reason: str) -> DemonstrationBatch:
        reason = secrets.redact(reason)
        logger.warning("run %s: demonstrations of SFT step %d failed: %s", spec.run_id, step, reason)
        return DemonstrationBatch(run_id=spec.run_id, step=step, request_id=request_id,
                                  error=reason[:DEMONSTRATION_ERROR_CHARS])

    environment_spec = spec.environment
    if tool_call_format not in get_args(ToolCallFormat):
        return failed(f"unknown tool-call format {tool_call_format!r}")
    try:
        environment_class = load_environment_class(environment_spec)
    except EnvironmentLoadError as exc:
        return failed(f"environment {environment_spec.label} cannot be loaded: {exc}")
    try:
        environment = environment_class(**secrets.constructor_kwargs(environment_spec.settings))
        demonstrations = environment.demonstrations(count, random.Random(seed))
        if inspect.isawaitable(demonstrations):
            # A remote environment's (HTTP) are fetched, on the loop and session episodes use.
            demonstrations = process_episode_loop.run(
                _awaited(environment, demonstrations), timeout_s=spec.config.rollout.environment_timeout_s)
        messages = [
            [DemonstrationMessage.model_validate(message)
             for message in demonstration_messages(demonstration, environment.tools, tool_call_format)]
            for demonstration in demonstrations or ()
        ]
    except Exception as exc:  # the environment's code: any fault of it is the run's reason
        return failed(f"environment {environment_spec.label}: demonstrations() raised "
                      f"{type(exc).__name__}: {exc}")
    return DemonstrationBatch(run_id=spec.run_id, step=step, request_id=request_id, messages=messages)


async def _awaited(environment: Environment, demonstrations: Awaitable[list]) -> list:
    try:
        return await demonstrations
    finally:
        try:
            await environment.close()
        except Exception as exc:  # noqa: BLE001 - releasing it cannot undo the demonstrations
            logger.warning("closing %s after its demonstrations failed: %s: %s", type(environment).__name__,
                           type(exc).__name__, exc)


def produce_demonstrations(*, redis_url: str, run_id: int, step: int, count: int, seed: int,
                           tool_call_format: str, request_id: str, refused_reason: str = "",
                           ) -> DemonstrationBatch | None:
    """Entry point of a demonstrations task: answer the request on the run's stream.

    ``refused_reason``: the task is not run again (its earlier deliveries each
    killed their worker, workers/redelivery.py, or its secret settings never came);
    the answer is that error. None (nothing written): the run has ended, or its spec
    is gone with its keys; no trainer waits for the answer.

    Raises:
      RunNotReadyError: the environment's secret settings are not in Redis yet; the task retries.
    """
    client = durable_redis(redis_url)
    try:
        raw = client.get(run_spec_key(run_id))
        if raw is None or client.exists(run_stop_key(run_id)):
            return None
        if refused_reason:
            batch = DemonstrationBatch(run_id=run_id, step=step, request_id=request_id,
                                       error=refused_reason[:DEMONSTRATION_ERROR_CHARS])
        else:
            spec = RunSpec.model_validate_json(raw)
            try:
                secrets = load_environment_secrets(client, spec)
            except SecretSettingsUndecryptableError as exc:
                # This worker's key will not do on any retry: the trainer fails the SFT step saying why.
                secrets, batch = None, DemonstrationBatch(run_id=run_id, step=step, request_id=request_id,
                                                          error=str(exc)[:DEMONSTRATION_ERROR_CHARS])
            if secrets is not None:
                redact_run_logs_with(secrets)
                batch = demonstration_batch(spec, step=step, count=count, seed=seed,
                                            tool_call_format=tool_call_format, request_id=request_id,
                                            secrets=secrets)
        client.xadd(demonstration_stream(run_id), batch.to_stream_fields(), maxlen=_STREAM_MAXLEN,
                    approximate=False)
        return batch
    finally:
        client.close()
