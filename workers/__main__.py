"""``python -m workers``: a Celery rollout worker process (what ``tandem worker`` runs)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from tandem.contracts import EVALUATION_QUEUE, PROBE_QUEUE, ROLLOUT_QUEUE
from tandem.runtime.process_start import DEFAULT_REDIS_URL, redis_url

#: What a rollout worker consumes unless told otherwise: episodes, environment probes, evaluations.
DEFAULT_QUEUES = ",".join((ROLLOUT_QUEUE, PROBE_QUEUE, EVALUATION_QUEUE))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem worker", description="run a Celery rollout worker process")
    parser.add_argument("--redis-url", help=f"default: $REDIS_URL or {DEFAULT_REDIS_URL}")
    parser.add_argument("--name", help="Celery node name, e.g. rollouts-1@%%h")
    parser.add_argument("--loglevel", default="INFO")
    parser.add_argument("--concurrency", type=int, default=4,
                        help="rollout tasks this process runs at once (each runs many episodes)")
    parser.add_argument("--queues", default=DEFAULT_QUEUES,
                        help=f"Celery queues to consume (default {DEFAULT_QUEUES}): {ROLLOUT_QUEUE} (episodes), "
                        f"{PROBE_QUEUE} (environment probes) and {EVALUATION_QUEUE} (held-out evaluation episodes)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # Read when workers.app is imported: set first.
    os.environ["REDIS_URL"] = redis_url(args.redis_url)
    # The inference engine sizes its batch for every task thread's episodes.
    os.environ["TANDEM_WORKER_CONCURRENCY"] = str(args.concurrency)
    from workers.app import app

    # Threads, not prefork: nothing forks after JAX starts, and the task threads
    # of one process share its inference engine, which batches their episodes together.
    argv = ["worker", "--pool", "threads", "--concurrency", str(args.concurrency), "--queues", args.queues,
            "--loglevel", args.loglevel, "--without-gossip", "--without-mingle"]
    if args.name:
        argv += ["--hostname", args.name]
    app.worker_main(argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
