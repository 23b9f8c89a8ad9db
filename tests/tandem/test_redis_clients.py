"""The long-lived processes' Redis clients ride out a Redis restart (a real redis-server of the test's own)."""

from __future__ import annotations

import asyncio
import subprocess
import threading
from pathlib import Path

import pytest
import redis
from celery import Celery

from tandem.runtime.local_ports import free_local_port
from tandem.runtime.redis_clients import (
    ASYNC_REPLY_TIMEOUT_S,
    durable_async_redis,
    durable_redis,
    durable_task_publishing,
)
from tests.redis_servers import PERSISTENT, start_redis_server


def _start(port: int, directory: Path) -> subprocess.Popen:
    return start_redis_server(port, directory, *PERSISTENT)


@pytest.fixture
def restartable_redis(tmp_path):
    port = free_local_port()
    servers = [_start(port, tmp_path)]
    timers: list[threading.Timer] = []

    def restart_after(seconds: float) -> threading.Thread:
        servers[-1].kill()
        servers[-1].wait(timeout=10)
        thread = threading.Timer(seconds, lambda: servers.append(_start(port, tmp_path)))
        thread.start()
        timers.append(thread)
        return thread

    yield port, restart_after
    for timer in timers:  # a test that failed before its restart still stops the server it started
        timer.join()
    for server in servers:
        server.kill()
        server.wait(timeout=10)


def test_a_command_sent_while_redis_is_down_runs_once_it_is_back(restartable_redis, caplog):
    """Before, a plain client raised ConnectionError: the trainer's stream read, and its run, died with it."""
    port, restart_after = restartable_redis
    client = durable_redis(f"redis://127.0.0.1:{port}/0")
    client.set("before", "1")

    restarted = restart_after(1.5)
    assert client.set("during", "2")  # blocks until the server is back
    restarted.join()

    assert client.get("before") == b"1" and client.get("during") == b"2"  # the append-only file kept "before"
    assert "unreachable" in caplog.text  # a Redis that stays away is logged, not a silent hang
    client.close()


def test_a_task_sent_while_redis_is_down_is_queued_once_it_is_back(restartable_redis, caplog):
    """Before, Celery's default publish retries gave up after about 0.6 s: the trainer's request for
    rollouts raised OperationalError and failed its run (seen in CI: tests/e2e/test_restarts.py)."""
    port, restart_after = restartable_redis
    url = f"redis://127.0.0.1:{port}/0"
    app = Celery("publishing_test", broker=url)
    app.conf.update(task_serializer="json", accept_content=["json"], **durable_task_publishing(url))
    app.send_task("tandem.test.before", args=[1], queue="publishing-test")

    restarted = restart_after(3)
    app.send_task("tandem.test.during", args=[2], queue="publishing-test")  # blocks until the server is back
    restarted.join()

    assert redis.Redis(port=port).llen("publishing-test") == 2
    assert "unreachable for a task's publish" in caplog.text
    app.close()


def test_the_async_client_rides_out_the_restart_too(restartable_redis):
    port, restart_after = restartable_redis

    async def produce() -> bytes:
        client = durable_async_redis(f"redis://127.0.0.1:{port}/0")
        await client.xadd("stream", {"a": "1"})
        restarted = restart_after(1.5)
        await client.xadd("stream", {"a": "2"})
        restarted.join()
        length = await client.xlen("stream")
        await client.aclose()
        return length

    assert asyncio.run(produce()) == 2


def test_the_async_client_waits_for_a_connection_instead_of_refusing_past_its_pool(redis_url):
    """A producer's episodes share one client: more commands at once than its pool has connections
    (an evaluation's episodes beside training) wait their turn. redis-py's own pool raised
    MaxConnectionsError past 100."""
    client = durable_async_redis(redis_url)
    key = f"tandem:test:empty-list:{free_local_port()}"

    async def many() -> list:
        # Each BLPOP holds a connection until its timeout: 150 of them at once need 150.
        return await asyncio.gather(*[client.blpop(key, timeout=0.3) for _ in range(150)])

    async def run() -> list:
        try:
            return await many()
        finally:
            await client.aclose()

    assert asyncio.run(run()) == [None] * 150


def test_a_reply_that_never_comes_costs_the_async_client_a_timeout_and_a_retry_not_a_hang(redis_url):
    """redis-py waits for a reply forever by default: most likely how one EVALSHA of an episode slot
    held a CI run for 600 s. A proxy in front of the real Redis forwards every command but swallows
    all the replies of its first connection."""
    upstream = redis.Redis.from_url(redis_url).connection_pool.connection_kwargs
    key = f"tandem:test:lost-reply:{free_local_port()}"
    connections = []

    async def relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, swallow: bool) -> None:
        try:
            while data := await reader.read(65536):
                if not swallow:
                    writer.write(data)
                    await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def proxied(client_reader, client_writer) -> None:
        connections.append(client_writer)
        server_reader, server_writer = await asyncio.open_connection(upstream["host"], upstream["port"])
        await asyncio.gather(relay(client_reader, server_writer, swallow=False),
                             relay(server_reader, client_writer, swallow=len(connections) == 1))

    async def run() -> tuple[int, bytes]:
        proxy = await asyncio.start_server(proxied, "127.0.0.1", 0)
        port = proxy.sockets[0].getsockname()[1]
        client = durable_async_redis(f"redis://127.0.0.1:{port}/{upstream.get('db', 0)}", socket_timeout=0.5)
        try:
            reply = await asyncio.wait_for(client.incr(key), 60)
            return reply, await client.get(key)
        finally:
            await client.aclose()
            proxy.close()

    try:
        reply, stored = asyncio.run(run())
    finally:
        redis.Redis.from_url(redis_url).delete(key)
    assert len(connections) >= 2  # the first connection was given up on
    # INCR reached Redis on the first connection too: the retry ran it again, so the key may be 2.
    assert stored == str(reply).encode() and reply >= 1


def test_the_async_client_has_a_reply_timeout_by_default(redis_url):
    kwargs = durable_async_redis(redis_url).connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == ASYNC_REPLY_TIMEOUT_S
    assert kwargs["socket_connect_timeout"] == ASYNC_REPLY_TIMEOUT_S
