"""Celery tasks of rollout producers: thin wrappers that take IDs."""

from __future__ import annotations

import dataclasses

from tandem.contracts import (
    DEMONSTRATIONS,
    EVALUATIONS,
    PROBE,
    PROBE_REPORT,
    ROLLOUTS,
    EvaluationRequest,
)
from workers.app import app
from workers.demonstrations import produce_demonstrations
from workers.evaluation import EvaluationSliceError, produce_evaluation, report_slice_failure
from workers.probe import probe_by_id
from workers.producer import RunNotReadyError, produce
from workers.redelivery import crash_guard
from workers.settings import redis_url

# Episodes of a run whose spec, weights or secret settings are not in Redis yet are tried
# again, about a second to ten apart, for a few minutes.
_RETRIED_UNTIL_THE_RUN_IS_READY = {"autoretry_for": (RunNotReadyError,), "retry_backoff": 1,
                                   "retry_backoff_max": 10, "max_retries": 30}


@app.task(name=ROLLOUTS.name, bind=True, **_RETRIED_UNTIL_THE_RUN_IS_READY)
def produce_rollouts(self, run_id: int, first_group_index: int, num_groups: int) -> dict:
    """Run ``num_groups`` episode groups of run ``run_id``, starting at ``first_group_index``.

    A task whose earlier deliveries each killed their worker (out of memory, say: acks_late
    redelivers it) goes to the run's dead letters after MAX_CRASHED_DELIVERIES instead of
    crash-looping every worker (workers.redelivery).
    """
    with crash_guard(redis_url(), task_id=self.request.id, run_id=run_id,
                     what=f"groups {first_group_index}..{first_group_index + num_groups - 1}") as guard:
        if guard.dead_lettered:
            return {"run_id": run_id, "dead_lettered": True, "reason": guard.reason}
        summary = produce(
            redis_url=redis_url(), run_id=run_id, first_group_index=first_group_index,
            num_groups=num_groups,
        )
    return dataclasses.asdict(summary)


# Tries of a demonstrations task whose run is not ready (its environment's secret settings
# not in Redis yet), a second or so apart, before it answers with that error.
_DEMONSTRATIONS_MAX_RETRIES = 30


@app.task(
    name=DEMONSTRATIONS.name,
    bind=True,
    # The threads pool enforces no Celery time limit; these bound it under prefork. A step's
    # demonstrations take milliseconds to seconds; one that hangs leaves the trainer logging
    # that it waits, never training on half a batch.
    soft_time_limit=240,
    time_limit=300,
)
def make_demonstrations(self, run_id: int, step: int, count: int, seed: int, tool_call_format: str,
                        request_id: str) -> dict:
    """Answer the trainer's request ``request_id`` for the demonstrations of SFT ``step`` of run ``run_id``.

    Environment code that kills its worker is redelivered (acks_late) like a rollout
    task's; past MAX_CRASHED_DELIVERIES the answer is that error, so the run fails with
    it. A run not ready yet is tried again, and answered with why once the tries are spent.
    """
    arguments = dict(redis_url=redis_url(), run_id=run_id, step=step, count=count, seed=seed,
                     tool_call_format=tool_call_format, request_id=request_id)
    with crash_guard(redis_url(), task_id=self.request.id, run_id=run_id,
                     what=f"demonstrations of SFT step {step}") as guard:
        try:
            batch = produce_demonstrations(**arguments,
                                           refused_reason=guard.reason if guard.dead_lettered else "")
        except RunNotReadyError as exc:
            if self.request.retries < _DEMONSTRATIONS_MAX_RETRIES:
                raise self.retry(exc=exc, countdown=1, max_retries=_DEMONSTRATIONS_MAX_RETRIES) from exc
            batch = produce_demonstrations(**arguments, refused_reason=str(exc))
    if batch is None:
        return {"run_id": run_id, "step": step, "skipped": True}
    return {"run_id": run_id, "step": step, "demonstrations": len(batch.messages), "error": batch.error}


@app.task(name=EVALUATIONS.name, bind=True, **_RETRIED_UNTIL_THE_RUN_IS_READY)
def produce_evaluation_episodes(self, request: str) -> dict:
    """Run one slice of a held-out evaluation (``request``: an EvaluationRequest as JSON)."""
    evaluation = EvaluationRequest.model_validate_json(request)
    with crash_guard(redis_url(), task_id=self.request.id, run_id=evaluation.run_id,
                     what=f"evaluation {evaluation.evaluation} tasks {evaluation.first_task}.."
                          f"{evaluation.first_task + evaluation.tasks - 1}") as guard:
        if guard.dead_lettered:
            report_slice_failure(redis_url=redis_url(), request=evaluation, reason=guard.reason)
            return {"run_id": evaluation.run_id, "dead_lettered": True, "reason": guard.reason}
        try:
            episodes = produce_evaluation(redis_url=redis_url(), request=evaluation)
        except Exception as exc:
            # Retried while the run may still get ready; past that, or on any other error, the
            # trainer hears of it now rather than at evaluation.timeout_s.
            if isinstance(exc, RunNotReadyError) and self.request.retries < self.max_retries:
                raise
            reason = str(exc) if isinstance(exc, EvaluationSliceError) else f"{type(exc).__name__}: {exc}"
            report_slice_failure(redis_url=redis_url(), request=evaluation, reason=reason)
            raise
    return {"run_id": evaluation.run_id, "evaluation": evaluation.evaluation, "episodes": episodes}


@app.task(
    name=PROBE.name,
    # The probe's own per-check timeouts are what hold: the threads pool enforces
    # no Celery time limit. These bound it under prefork, above the sum of the
    # default check timeouts (ProbeTimeouts: 10 + 60 + 60 + 20 + 10 + 20 + 10 + 20 + 10 seconds,
    # and 900 for a requested baseline).
    soft_time_limit=1200,
    time_limit=1260,
)
def probe_environment(probe_id: int) -> None:
    """Probe the environment version the platform asked about under ``probe_id``; report back."""
    report = probe_by_id(redis_url=redis_url(), probe_id=probe_id)
    # The platform's worker has the database; the rollout worker needs only Redis.
    app.send_task(PROBE_REPORT.name, args=[report.model_dump(mode="json")])  # to its queue by task_routes
