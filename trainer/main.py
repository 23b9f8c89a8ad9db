"""The trainer process: claim queued runs from the platform and train them, one at a time."""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path

import redis
from celery import Celery

from tandem.contracts import TrainerHeartbeat
from trainer.platform_client import PlatformClient
from trainer.run_loop import RunTrainer, TrainerSettings
from trainer.sharding import initialize_distributed

logger = logging.getLogger("tandem.trainer")


def serve(*, platform_url: str, token: str, redis_url: str, checkpoint_root: Path,
          poll_s: float = 1.0, max_runs: int | None = None) -> int:
    """Claim and train runs until interrupted (or ``max_runs`` were trained); returns runs trained."""
    # Joins a multi-host JAX job when TANDEM_COORDINATOR_ADDRESS etc. are set; a no-op on one host.
    initialize_distributed()
    consumer = f"{socket.gethostname()}:{os.getpid()}"
    platform = PlatformClient(platform_url, token)
    redis_client = redis.Redis.from_url(redis_url)
    # A bare client: the trainer sends rollout tasks by name and never imports worker code.
    celery_app = Celery("tandem_trainer", broker=redis_url)
    celery_app.conf.update(task_serializer="json", accept_content=["json"])
    settings = TrainerSettings(redis_url=redis_url, checkpoint_root=checkpoint_root, consumer_name=consumer)
    trained = 0
    logger.info("trainer %s waiting for runs at %s", consumer, platform_url)
    try:
        while max_runs is None or trained < max_runs:
            claimed = platform.claim(consumer)
            if claimed is None:
                time.sleep(poll_s)
                continue
            logger.info("claimed run %s (%s)", claimed.run_id, claimed.name)
            try:
                status = RunTrainer(claimed, settings=settings, platform=platform,
                                    redis_client=redis_client, celery_app=celery_app).run()
                logger.info("run %s ended: %s", claimed.run_id, status)
            except KeyboardInterrupt:
                # Stopped by the operator: say so, rather than leave the run "running" forever.
                platform.heartbeat(
                    claimed.run_id, TrainerHeartbeat(status="failed", message="trainer process was stopped")
                )
                raise
            except Exception as exc:
                logger.exception("run %s failed", claimed.run_id)
                platform.heartbeat(
                    claimed.run_id,
                    TrainerHeartbeat(status="failed", message=f"trainer error: {type(exc).__name__}: {exc}"),
                )
            trained += 1
    finally:
        platform.close()
        redis_client.close()
    return trained
