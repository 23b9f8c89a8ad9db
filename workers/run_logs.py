"""A producer task's log records belong to its run: the scope set around each task.

Celery's ``task_prerun`` and ``task_postrun`` signals run in the task's own thread,
around the task and around Celery's own report of its outcome (a failure's
traceback included), so everything logged in between, by the task's thread and
by the episodes it hands to the process's episode loop (``run_coroutine_threadsafe``
and ``asyncio.gather`` copy the context they start from), carries the run's scope
(``tandem/runtime/run_logs.py``). The inference engine's thread serves every run at once
and stays unattributed.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import threading
from collections.abc import Callable

from celery.signals import task_postrun, task_prerun

from tandem.contracts import (
    DEMONSTRATIONS_TASK_NAME,
    EVALUATION_TASK_NAME,
    ROLLOUT_TASK_NAME,
    EvaluationRequest,
)
from tandem.runtime.run_logs import current_run_log_scope, run_log_scope
from workers.secret_settings import SecretSettings

logger = logging.getLogger(__name__)

# The run of each task that works for one, from its arguments (by name, however they were sent).
_RUN_OF_TASK: dict[str, Callable[[dict], int]] = {
    ROLLOUT_TASK_NAME: lambda arguments: int(arguments["run_id"]),
    DEMONSTRATIONS_TASK_NAME: lambda arguments: int(arguments["run_id"]),
    EVALUATION_TASK_NAME: lambda arguments: EvaluationRequest.model_validate_json(arguments["request"]).run_id,
}

# Task id -> the scope it entered; left by the same thread at task_postrun.
_open_scopes: dict[str, contextlib.ExitStack] = {}
_open_scopes_lock = threading.Lock()


def task_run_id(task, args: tuple, kwargs: dict) -> int | None:
    """The run a task works for, or None (probes, unknown tasks, arguments that do not say)."""
    run_of = _RUN_OF_TASK.get(getattr(task, "name", ""))
    if run_of is None:
        return None
    try:
        arguments = inspect.signature(task.run).bind(*(args or ()), **(kwargs or {})).arguments
        return run_of(arguments)
    except Exception:  # noqa: BLE001 - malformed arguments: the task itself says so, unattributed
        return None


@task_prerun.connect
def _enter_run_log_scope(task_id=None, task=None, args=(), kwargs=None, **_):
    run_id = task_run_id(task, args, kwargs or {})
    if run_id is None or task_id is None:
        return
    stack = contextlib.ExitStack()
    stack.enter_context(run_log_scope(run_id))
    with _open_scopes_lock:
        _open_scopes[task_id] = stack


@task_postrun.connect
def _leave_run_log_scope(task_id=None, **_):
    with _open_scopes_lock:
        stack = _open_scopes.pop(task_id, None)
    if stack is not None:
        stack.close()


def redact_run_logs_with(secrets: SecretSettings) -> None:
    """From now on, the current task's records have ``secrets``' values replaced by their names."""
    scope = current_run_log_scope()
    if scope is not None and secrets.names:
        scope.redact_with(secrets.redact)
