"""The Celery app of rollout producers.

Workers run Celery's ``threads`` pool (``tandem worker --concurrency N``):
each task runs many episodes concurrently with asyncio, and the task
threads of one process share that process's inference engine, which batches
all of their episodes together. Nothing forks after JAX initialises
(prefork would fork a parent that may have touched JAX, which deadlocks
XLA's thread pools), and scaling out is more worker processes or hosts.
"""

from __future__ import annotations

from celery import Celery
from celery.signals import worker_ready, worker_shutdown

from tandem.contracts import ROLLOUT_QUEUE, task_routes
from tandem.runtime.process_reports import start_process_reporter, stop_process_reporter
from tandem.runtime.redis_clients import durable_task_publishing
from tandem.runtime.run_logs import start_run_log_shipping, stop_run_log_shipping
from workers import run_logs as _run_log_scopes  # noqa: F401 - connects the task signals that scope records
from workers.activity import process_activity
from workers.settings import ROLLOUT_TASK_TIME_LIMIT_S, redis_url

app = Celery("tandem_workers", broker=redis_url(), include=["workers.tasks"])

app.conf.update(
    task_default_queue=ROLLOUT_QUEUE,
    # Every task to its queue, from the one table (tandem.contracts.tasks): rollouts and SFT
    # demonstrations on `rollouts`, evaluations, probes, and the probe reports the platform records.
    task_routes=task_routes(),
    task_serializer="json",
    accept_content=["json"],
    # Results are never read: trajectories travel through the run's stream.
    task_ignore_result=True,
    # A rollout task is acknowledged only after it ran, so a worker killed
    # mid-task has its task redelivered. That is safe: a redelivered task
    # regenerates the same group ids and the trainer trains each group once.
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    # One task in hand per worker: a busy worker must not hoard the backlog
    # that an idle worker could be running.
    worker_prefetch_multiplier=1,
    # Redis redelivers an unacknowledged task after this long. It must exceed
    # the longest task or a slow task would run twice; twice the time limit.
    broker_transport_options={"visibility_timeout": 2 * ROLLOUT_TASK_TIME_LIMIT_S},
    # No task_time_limit: Celery's threads pool ignores time limits. A rollout
    # task cancels its own episodes after ROLLOUT_TASK_TIME_LIMIT_S (15 minutes:
    # a task runs a few groups, so minutes mean an environment or generation is
    # stuck) or its run's rollout.timeout_s, whichever is shorter, since by then
    # the trainer has counted its groups lost and asked for them again.
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    # A probe's report waits out a Redis restart rather than being lost with the task.
    **durable_task_publishing(redis_url()),
)


# Every rollout worker reports its CPU and memory (and the runs of its running tasks)
# for the devices page, idle or busy. Started once the worker is ready, in the
# process that runs the tasks (the threads pool forks nothing); signals are
# process-wide, so the handlers check that the worker is this app's.
@worker_ready.connect
def _start_process_report(sender, **_):
    if sender.app is app:
        start_process_reporter(redis_url=redis_url(), role="rollout_worker", name=sender.hostname,
                               run_ids=process_activity.running_run_ids)
        # What a task logs goes to its run's log too (workers/run_logs.py scopes each task).
        start_run_log_shipping(redis_url=redis_url(), role="rollout_worker")
        # An ended run's engines give their memory back. Imported here: it loads the engine (JAX),
        # which this module, imported by whoever sends tasks, must not.
        from workers.engine_release import start_engine_release
        start_engine_release(redis_url=redis_url())


@worker_shutdown.connect
def _stop_process_report(sender, **_):
    if sender.app is app:
        from workers.engine_release import stop_engine_release
        stop_engine_release()
        stop_run_log_shipping()
        stop_process_reporter()
