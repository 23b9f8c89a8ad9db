"""An ended run's inference engines leave the worker within seconds, not when newer runs push them out.

A rollout worker keeps each run's engine (weights, KV cache, compiled buckets' state) warm across
tasks. Once the run stops (finished, failed, paused or cancelled: the platform and the trainer set its
stop key), a thread of the worker process closes the engines no task uses, training's and
evaluation's, so their memory goes back to the host while the worker idles or serves other runs.
"""

from __future__ import annotations

import logging
import threading

import redis

from tandem.runtime.redis_clients import durable_redis
from tandem.runtime.resource_usage import return_freed_memory
from workers.evaluation import release_stopped_evaluation_runtimes
from workers.producer import release_stopped_runtimes

logger = logging.getLogger(__name__)

#: Seconds between two looks at the stop keys of the runs whose engines the process holds.
RELEASE_INTERVAL_S = 5.0


def release_stopped_engines(client: redis.Redis) -> list[int]:
    """Close every idle engine of a stopped run in this process; returns the runs released."""
    released = set(release_stopped_runtimes(client))
    released.update(run_id for run_id, _ in release_stopped_evaluation_runtimes(client))
    if released:
        return_freed_memory()
    return sorted(released)


class _Releaser:
    def __init__(self, redis_url: str, interval_s: float):
        self._client = durable_redis(redis_url)
        self._interval_s = interval_s
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="tandem-engine-release", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stopping.wait(self._interval_s):
            try:
                release_stopped_engines(self._client)
            except redis.RedisError as exc:  # Redis away: the engines wait for the next look
                logger.warning("cannot read the runs' stop keys to release their engines: %s", exc)

    def stop(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=10)
        self._client.close()


_releaser: _Releaser | None = None
_releaser_lock = threading.Lock()


def start_engine_release(*, redis_url: str, interval_s: float = RELEASE_INTERVAL_S) -> None:
    """Start this process's releasing thread; starting it again changes nothing."""
    global _releaser
    with _releaser_lock:
        if _releaser is None:
            _releaser = _Releaser(redis_url, interval_s)


def stop_engine_release() -> None:
    global _releaser
    with _releaser_lock:
        releaser, _releaser = _releaser, None
    if releaser is not None:
        releaser.stop()
