"""One asyncio event loop per producer process, running the episodes of every rollout task.

Celery's threads pool runs each rollout task in a thread of its own. Each task
hands its episodes to this process's loop and waits for them, so every episode
of the process shares one loop, one Redis connection pool and the HTTP
environments' session, with its kept-alive connections, and their schemas
(:class:`~environments.adapters.http.SharedHTTPSession`). With a loop per task,
each task opened its own Redis connection and each episode its own HTTP
connection, and the task threads' loops competed for the GIL with the
inference engine's thread.

Environments must not block the loop: one that does stalls every episode of
the process, not only its own. Blocking code belongs in
``asyncio.to_thread``, as the Gymnasium adapter does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import redis.asyncio as aioredis

from environments import SharedHTTPSession, shared_http_session
from tandem.runtime.redis_clients import durable_async_redis

T = TypeVar("T")


class EpisodeLoop:
    """An event loop in a daemon thread of its own, started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._redis: dict[str, aioredis.Redis] = {}
        self.http_session = SharedHTTPSession()

    def run(self, coroutine: Coroutine[Any, Any, T], *, timeout_s: float | None = None) -> T:
        """Run ``coroutine`` on the loop, with the shared HTTP session, and wait for its result.

        After ``timeout_s`` the coroutine is cancelled and TimeoutError raised.
        """
        loop = self._started()
        if threading.current_thread() is self._thread:
            coroutine.close()
            raise RuntimeError("EpisodeLoop.run() called from the loop's own thread would wait forever")
        future = asyncio.run_coroutine_threadsafe(self._with_shared_session(coroutine), loop)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"cancelled after {timeout_s:g}s") from None

    def redis(self, url: str) -> aioredis.Redis:
        """The loop's Redis client of ``url``; use it only in coroutines running on the loop."""
        with self._lock:
            client = self._redis.get(url)
            if client is None:
                client = self._redis[url] = durable_async_redis(url)
            return client

    async def _with_shared_session(self, coroutine: Coroutine[Any, Any, T]) -> T:
        shared_http_session.set(self.http_session)  # this task's context, and its episodes' copies
        return await coroutine

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name="episode-loop", daemon=True)
                self._thread.start()
            return self._loop


#: The episode loop of this process; rollout tasks run their episodes on it.
process_episode_loop = EpisodeLoop()
