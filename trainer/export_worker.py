"""The export worker: safetensors exports of checkpoints, on the trainer side, where JAX is.

``tandem export-worker`` (``python -m trainer.export_worker``) is a Celery worker of the
``exports`` queue on the Redis broker; it needs no database and no platform token. The platform
sends it a :class:`CheckpointExportRequest` (checkpoints.services.checkpoint_export_start); it
restores the step, writes the Hugging Face files (trainer.checkpoint_export) and sends the outcome,
a :class:`CheckpointExportReport`, to the platform queue, where the platform records it. So the
platform never loads JAX, and an hour's export never holds the platform worker's probe reports,
reaper or log drains.

Prefork with one child: the parent never imports JAX (the task does, in the child, so nothing
forks after JAX initialises) and enforces the time limits by killing a stuck child.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import time
from pathlib import Path

from celery import Celery
from celery.signals import worker_ready, worker_shutdown

from tandem.contracts import (
    CHECKPOINT_EXPORT,
    CHECKPOINT_EXPORT_REPORT,
    CHECKPOINT_EXPORT_TIME_LIMIT_S,
    CheckpointExportReport,
    CheckpointExportRequest,
    CheckpointExportStatus,
    task_routes,
)
from tandem.runtime.process_reports import start_process_reporter, stop_process_reporter
from tandem.runtime.process_start import DEFAULT_REDIS_URL, redis_url
from tandem.runtime.redis_clients import durable_task_publishing

logger = logging.getLogger("tandem.export_worker")

# A large model's export reads and writes gigabytes. Past the soft limit the export fails with
# that reason (reported like any failure); the hard limit kills a child that ignores it.
EXPORT_TIME_LIMIT_S = CHECKPOINT_EXPORT_TIME_LIMIT_S
EXPORT_SOFT_TIME_LIMIT_S = EXPORT_TIME_LIMIT_S - 60

app = Celery("tandem_exports", broker=redis_url())
app.conf.update(
    # An export's report waits out a Redis restart rather than being lost after a long export.
    **durable_task_publishing(app.conf.broker_url),
    task_default_queue=CHECKPOINT_EXPORT.queue,
    task_routes=task_routes(),
    task_serializer="json",
    accept_content=["json"],
    # The outcome goes to the platform as a task of its own, never through Celery results.
    task_ignore_result=True,
    # One export in hand: a second waits on the queue for whichever worker is free.
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
)


# The export worker reports its CPU and memory for the devices page, as every Tandem process does
# (the prefork parent's; signals are process-wide, so the handlers check that the worker is this app's).
@worker_ready.connect
def _start_process_report(sender, **_):
    if sender.app is app:
        start_process_reporter(redis_url=app.conf.broker_url, role="export_worker", name=sender.hostname)


@worker_shutdown.connect
def _stop_process_report(sender, **_):
    if sender.app is app:
        stop_process_reporter()


def run_export(request: CheckpointExportRequest) -> CheckpointExportReport:
    """Do ``request``'s export; any failure is its outcome (the report says why), never an exception."""
    started_at = time.time()
    logger.info("exporting checkpoint %s: step %s of %s to %s", request.checkpoint_id, request.step,
                request.run_directory, request.destination)
    # JAX and the model code load here, in the process that exports.
    from trainer.checkpoint_export import export_checkpoint

    outcome: dict = {}
    try:
        files = export_checkpoint(request.run_config, run_directory=Path(request.run_directory), step=request.step,
                                  destination=Path(request.destination))
    except Exception as exc:  # any failure is the export's outcome, shown to the user
        logger.exception("export of checkpoint %s failed", request.checkpoint_id)
        outcome = {"status": CheckpointExportStatus.FAILED, "error": f"{type(exc).__name__}: {exc}"}
    else:
        outcome = {"status": CheckpointExportStatus.EXPORTED, "files": tuple(sorted(path.name for path in files)),
                   "size_bytes": sum(path.stat().st_size for path in files)}
    return CheckpointExportReport(checkpoint_id=request.checkpoint_id, destination=request.destination,
                                  requested_at=request.requested_at,
                                  worker=f"{socket.gethostname()}:{os.getpid()}", started_at=started_at,
                                  finished_at=time.time(), **outcome)


@app.task(name=CHECKPOINT_EXPORT.name, soft_time_limit=EXPORT_SOFT_TIME_LIMIT_S, time_limit=EXPORT_TIME_LIMIT_S)
def export_checkpoint_task(request: dict) -> str:
    """Export the checkpoint ``request`` (a CheckpointExportRequest as JSON) names; report to the platform."""
    report = run_export(CheckpointExportRequest.model_validate(request))
    # The platform's worker has the database; this one needs only Redis and the checkpoint files.
    app.send_task(CHECKPOINT_EXPORT_REPORT.name, args=[report.model_dump(mode="json")])  # by task_routes
    return report.status


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.export_worker", description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", help=f"the broker; default: $REDIS_URL or {DEFAULT_REDIS_URL}")
    parser.add_argument("--name", default="exports@%h", help="the Celery worker's hostname")
    parser.add_argument("--concurrency", type=int, default=1, help="exports at once (each loads a model)")
    parser.add_argument("--loglevel", default="INFO")
    args = parser.parse_args(argv)
    if args.redis_url:
        app.conf.update(broker_url=args.redis_url, **durable_task_publishing(args.redis_url))
    app.worker_main(["worker", "--pool", "prefork", "--concurrency", str(args.concurrency),
                     "--queues", CHECKPOINT_EXPORT.queue, "--loglevel", args.loglevel, "--hostname", args.name,
                     "--without-gossip", "--without-mingle"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
