"""Every Celery task that crosses a process boundary, and its queue: one table, read by all.

Senders send by name (the trainer never imports the worker code, the platform never imports
the trainer's), workers declare their tasks from it, the platform's tasks and its beat schedule
take their names and queues from it, and :func:`task_routes` gives Celery's ``task_routes``
setting, so a sender never names a queue. No task name or queue is typed anywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Bumped when a task is renamed or moves to another queue: processes of one deployment agree on it.
TASK_TABLE_VERSION = 1

# Queues.
ROLLOUT_QUEUE = "rollouts"
# A queue of its own, so that an operator can give evaluation workers of its own
# (`tandem worker --queues evaluations`) and keep them off the rollout workers.
EVALUATION_QUEUE = "evaluations"
# Conformance probes of registered environments run where environments run (the
# rollout workers, `tandem worker` consumes both queues); their reports go back
# to the platform's own Celery worker, which has the database. Workers keep
# needing nothing but Redis.
PROBE_QUEUE = "probes"
# Safetensors exports of checkpoints run where JAX runs, on a trainer-side worker of their own
# (`tandem export-worker`, trainer/export_worker.py), which reports back on the platform queue:
# the platform never loads JAX, and an export of an hour never holds its worker.
EXPORTS_QUEUE = "exports"
PLATFORM_QUEUE = "platform"
# Platform work that waits on the outside world or on a big file runs on queues and workers of its
# own (`tandem platform-worker --queues ...`), so that probe reports, the reaper and log drains
# (PLATFORM_QUEUE) are never behind it: webhook posts to operators' receivers, and dataset
# uploads stored in batches with their derived statistics.
WEBHOOKS_QUEUE = "platform-webhooks"
DATASETS_QUEUE = "platform-datasets"
#: Every queue the platform's own workers consume, each by a worker of its own.
PLATFORM_QUEUES = (PLATFORM_QUEUE, WEBHOOKS_QUEUE, DATASETS_QUEUE)


@dataclass(frozen=True)
class TaskRoute:
    """A Celery task by name, the queue it is sent to, and what it does."""

    name: str
    queue: str
    doc: str


# Rollout production (workers/tasks.py), sent by the trainer.
ROLLOUTS = TaskRoute("tandem.rollouts.produce", ROLLOUT_QUEUE, "Episode groups of a run (args: run_id, "
                     "first_group_index, num_groups).")
# An SFT step's demonstrations are made where environment code runs, on the same
# queue, so that every rollout worker answers them and the trainer never imports
# an environment. Keyword arguments: run_id, step, count, seed, tool_call_format,
# request_id; the answer is a DemonstrationBatch on the run's demonstration stream.
DEMONSTRATIONS = TaskRoute("tandem.demonstrations.produce", ROLLOUT_QUEUE, "An SFT step's demonstrations.")
# Held-out evaluation episodes, also made where environment code runs. One keyword
# argument, request: an EvaluationRequest as JSON; the episodes go to the run's evaluation stream.
EVALUATIONS = TaskRoute("tandem.evaluations.produce", EVALUATION_QUEUE, "A slice of a held-out evaluation.")
PROBE = TaskRoute("tandem.environments.probe", PROBE_QUEUE, "A conformance probe (arg: probe_id).")
# The platform's tasks (platform/*/tasks.py).
PROBE_REPORT = TaskRoute("tandem.environments.record_probe_report", PLATFORM_QUEUE,
                         "Record a probe's ProbeReport (sent by the rollout worker that ran it).")
HEALTH_SWEEP = TaskRoute("tandem.environments.health_sweep", PLATFORM_QUEUE,
                         "Beat: expire unanswered probes, probe every environment version in use.")
REAP_DEAD_TRAINERS = TaskRoute("tandem.platform.reap_dead_trainers", PLATFORM_QUEUE,
                               "Beat: restart or fail runs whose trainer stopped heartbeating.")
FLAG_STALLED_RUNS = TaskRoute("tandem.platform.flag_stalled_runs", PLATFORM_QUEUE,
                              "Beat: the progress watchdog.")
DRAIN_RUN_LOGS = TaskRoute("tandem.platform.drain_run_logs", PLATFORM_QUEUE,
                           "Beat: store what the runs' processes logged.")
CHECKPOINT_EXPORT = TaskRoute("tandem.checkpoints.export", EXPORTS_QUEUE,
                              "Write a checkpoint as safetensors (arg: a CheckpointExportRequest as JSON).")
CHECKPOINT_EXPORT_REPORT = TaskRoute("tandem.checkpoints.record_export", PLATFORM_QUEUE,
                                     "Record an export's CheckpointExportReport (sent by the export worker).")
EXPIRE_CHECKPOINT_EXPORTS = TaskRoute("tandem.checkpoints.expire_exports", PLATFORM_QUEUE,
                                      "Beat: fail the exports no export worker reported in time.")
WEBHOOK_DELIVERY = TaskRoute("tandem.alerts.deliver_webhook", WEBHOOKS_QUEUE, "Post an alert's webhook.")
WEBHOOK_RESUME = TaskRoute("tandem.alerts.resume_abandoned_webhook_deliveries", WEBHOOKS_QUEUE,
                           "Beat: send again the deliveries whose worker was killed mid-post.")
ADVANCE_SWEEPS = TaskRoute("tandem.sweeps.advance", PLATFORM_QUEUE,
                           "Beat: follow the sweeps' trials (report, prune, record), start their next runs.")
DATASET_STORE_VERSION = TaskRoute("tandem.datasets.store_version", DATASETS_QUEUE,
                                  "Store an uploaded dataset version's rows.")
DATASET_TOKEN_STATS = TaskRoute("tandem.datasets.compute_token_stats", DATASETS_QUEUE,
                                "Count a dataset version's tokens under one tokenizer.")

#: The table: every cross-process task.
TASKS: tuple[TaskRoute, ...] = (
    ROLLOUTS, DEMONSTRATIONS, EVALUATIONS, PROBE, PROBE_REPORT, HEALTH_SWEEP, REAP_DEAD_TRAINERS,
    FLAG_STALLED_RUNS, DRAIN_RUN_LOGS, CHECKPOINT_EXPORT, CHECKPOINT_EXPORT_REPORT, EXPIRE_CHECKPOINT_EXPORTS,
    WEBHOOK_DELIVERY,
    WEBHOOK_RESUME, DATASET_STORE_VERSION, DATASET_TOKEN_STATS, ADVANCE_SWEEPS,
)


def task_routes() -> dict[str, dict[str, str]]:
    """Celery's ``task_routes`` setting for the table: each task name to its queue."""
    return {task.name: {"queue": task.queue} for task in TASKS}


# The names as the senders of the workers' tasks use them (trainer/backlog.py, evaluation.py, ...).
ROLLOUT_TASK_NAME = ROLLOUTS.name
DEMONSTRATIONS_TASK_NAME = DEMONSTRATIONS.name
EVALUATION_TASK_NAME = EVALUATIONS.name
PROBE_TASK_NAME = PROBE.name
PROBE_REPORT_TASK_NAME = PROBE_REPORT.name
