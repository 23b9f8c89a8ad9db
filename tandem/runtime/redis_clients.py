"""Redis clients for Tandem's long-lived processes (trainer, producers): they ride out a Redis restart.

A command that meets a dropped connection, a refused one or a Redis still loading its
append-only file (``BusyLoadingError``) reconnects and runs again, with backoff, for as
long as it takes: a restarted Redis costs the processes a wait, never a crash. The
retries are logged, so that a Redis that stays away is seen, not a silent hang.

Tasks these processes send through Celery ride it out the same way
(:func:`durable_task_publishing`): Celery's own publish retries give up after about
0.6 s, which failed a run whose trainer asked for rollouts while Redis restarted.
"""

from __future__ import annotations

import logging

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import AbstractBackoff, ExponentialWithJitterBackoff
from redis.retry import Retry

logger = logging.getLogger(__name__)

# Doubling from BASE up to CAP seconds between tries.
RETRY_BASE_S = 0.1
RETRY_CAP_S = 5.0
RETRIED_ERRORS = (redis.ConnectionError, redis.TimeoutError)


class _LoggedBackoff(AbstractBackoff):
    """The jittered exponential backoff, with a log line on the first failure and about every minute after."""

    def __init__(self, url_label: str):
        self._inner = ExponentialWithJitterBackoff(cap=RETRY_CAP_S, base=RETRY_BASE_S)
        self._label = url_label

    def reset(self) -> None:
        self._inner.reset()

    def compute(self, failures: int) -> float:
        delay = self._inner.compute(failures)
        if failures == 1 or failures % 12 == 0:
            logger.warning("Redis at %s unreachable (%d failed tries); retrying", self._label, failures)
        return delay


def _url_label(url: str) -> str:
    """``url`` as log lines name it: credentials stay out."""
    return url.rsplit("@", 1)[-1]


def _retry_options(url: str, retry_class: type = Retry) -> dict:
    return {
        "retry": retry_class(_LoggedBackoff(_url_label(url)), retries=-1, supported_errors=RETRIED_ERRORS),
        "retry_on_error": list(RETRIED_ERRORS),
        "health_check_interval": 15,
        "socket_keepalive": True,
    }


def durable_redis(url: str, **options) -> redis.Redis:
    """A client whose commands retry across Redis restarts (see the module's docstring)."""
    return redis.Redis.from_url(url, **{**_retry_options(url), **options})


#: Connections one asyncio client opens at most; commands beyond them wait for a free one.
ASYNC_MAX_CONNECTIONS = 128
#: Seconds an asyncio client waits for a connection or for a reply before it drops the connection
#: and tries again. redis-py waits forever by default, so a reply that never comes holds an episode,
#: and its rollout task, until killed (most likely what hung a CI run for 600 s: an episode slot's
#: EVALSHA on loopback, its renewals still answered). The producers send no blocking commands on
#: these clients, so no answer takes this long.
ASYNC_REPLY_TIMEOUT_S = 30.0


def durable_async_redis(url: str, *, max_connections: int = ASYNC_MAX_CONNECTIONS, **options) -> aioredis.Redis:
    """:func:`durable_redis` for asyncio code (the producers' episode loops).

    Its pool blocks when every connection is in use: the default pool raises
    MaxConnectionsError past 100, which a producer running a few hundred episodes
    at once (an evaluation beside training) reaches. A reply that has not come after
    :data:`ASYNC_REPLY_TIMEOUT_S` counts as a dropped connection: the command runs
    again on a new one. Not for blocking commands that wait longer than that.
    """
    timeouts = {"socket_timeout": ASYNC_REPLY_TIMEOUT_S, "socket_connect_timeout": ASYNC_REPLY_TIMEOUT_S}
    pool = aioredis.BlockingConnectionPool.from_url(
        url, max_connections=max_connections, timeout=None,
        **{**_retry_options(url, AsyncRetry), **timeouts, **options})
    client = aioredis.Redis(connection_pool=pool)
    client.auto_close_connection_pool = True  # closing the client closes its pool, as from_url's do
    return client


def durable_task_publishing(url: str) -> dict:
    """Celery settings under which ``send_task`` on this broker retries across Redis restarts.

    kombu reconnects and publishes again, with backoff up to ``RETRY_CAP_S``, for as long as
    it takes (``max_retries`` None), logging each failed try as the clients above do.
    """
    label = _url_label(url)

    def log_failed_try(exc: Exception, _interval: float) -> None:
        logger.warning("Redis at %s unreachable for a task's publish (%s); retrying", label, exc)

    return {
        "task_publish_retry": True,
        "task_publish_retry_policy": {
            "max_retries": None, "interval_start": 0, "interval_step": RETRY_BASE_S * 5,
            "interval_max": RETRY_CAP_S, "errback": log_failed_try,
        },
    }
