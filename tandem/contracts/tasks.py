"""Celery task names and queues that cross process boundaries: senders use them by name."""

from __future__ import annotations

# Celery routing for rollout production. The trainer sends by name, so it
# never imports the worker code (and never drags JAX init order into Celery).
ROLLOUT_TASK_NAME = "tandem.rollouts.produce"
ROLLOUT_QUEUE = "rollouts"
# An SFT step's demonstrations are made where environment code runs, on the same
# queue, so that every rollout worker answers them and the trainer never imports
# an environment. Keyword arguments: run_id, step, count, seed, tool_call_format,
# request_id; the answer is a DemonstrationBatch on the run's demonstration stream.
DEMONSTRATIONS_TASK_NAME = "tandem.demonstrations.produce"
# Held-out evaluation episodes, also made where environment code runs. One keyword
# argument, request: an EvaluationRequest as JSON; the episodes go to the run's evaluation stream.
# A queue of its own, so that an operator can give evaluation workers of its own
# (`tandem worker --queues evaluations`) and keep them off the rollout workers.
EVALUATION_TASK_NAME = "tandem.evaluations.produce"
EVALUATION_QUEUE = "evaluations"


# Conformance probes of registered environments run where environments run (the
# rollout workers, `tandem worker` consumes both queues); their reports go back
# to the platform's own Celery worker, which has the database. Workers keep
# needing nothing but Redis.
PROBE_TASK_NAME = "tandem.environments.probe"
PROBE_QUEUE = "probes"
PROBE_REPORT_TASK_NAME = "tandem.environments.record_probe_report"
PLATFORM_QUEUE = "platform"
# Platform work that waits on the outside world or on a big file runs on queues and workers of its
# own (`tandem platform-worker --queues ...`), so that probe reports, the reaper and log drains
# (PLATFORM_QUEUE) are never behind it: webhook posts to operators' receivers, and dataset
# uploads stored in batches with their derived statistics.
WEBHOOKS_QUEUE = "platform-webhooks"
DATASETS_QUEUE = "platform-datasets"
#: Every queue the platform's own workers consume, each by a worker of its own.
PLATFORM_QUEUES = (PLATFORM_QUEUE, WEBHOOKS_QUEUE, DATASETS_QUEUE)
