"""Shipping log records to their run's stream: attribution, batching, dropping with a count, redaction.

On real Redis (and a redis-server of the test's own, for Redis going away and coming back).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading

import pytest
import redis

from tandem.contracts import RunLogRecord, run_log_stream
from tandem.runtime.local_ports import free_local_port
from tandem.runtime.run_logs import (
    RunLogShipper,
    current_run_log_scope,
    process_run_log_scope,
    run_log_scope,
)
from tests.redis_servers import start_redis_server

NEVER = 3600.0  # a flush interval that never comes within a test: it flushes when it says so


@pytest.fixture
def test_logger():
    """A logger of the test's own, at DEBUG, that does not reach the root's handlers."""
    log = logging.getLogger("tests.run_logs.subject")
    log.setLevel(logging.DEBUG)
    log.propagate = False
    yield log
    log.handlers.clear()


@pytest.fixture
def shipper_of(test_logger):
    made: list[RunLogShipper] = []

    def make(client: redis.Redis, **options) -> RunLogShipper:
        shipper = RunLogShipper(redis_client=client, role="rollout_worker", level=logging.INFO,
                                flush_interval_s=options.pop("flush_interval_s", NEVER), **options)
        test_logger.addHandler(shipper)
        made.append(shipper)
        return shipper

    yield make
    for shipper in made:
        test_logger.removeHandler(shipper)
        shipper.close()


def _records(client: redis.Redis, run_id: int) -> list[RunLogRecord]:
    return [RunLogRecord.from_stream_fields(fields) for _, fields in client.xrange(run_log_stream(run_id))]


@pytest.fixture
def clean_stream(redis_client):
    run_ids: list[int] = []
    yield run_ids.append
    for run_id in run_ids:
        redis_client.delete(run_log_stream(run_id))


def test_records_logged_in_a_run_scope_reach_that_run_with_level_process_and_traceback(
        redis_client, run_id, shipper_of, test_logger, clean_stream):
    clean_stream(run_id)
    shipper = shipper_of(redis_client)

    test_logger.info("outside any run")
    with run_log_scope(run_id):
        test_logger.info("episode %d started", 3)
        test_logger.debug("below the shipped level")
        try:
            raise ValueError("the checkpoint is corrupt")
        except ValueError:
            test_logger.exception("the run failed")
    test_logger.warning("outside again")
    shipper.flush()

    records = _records(redis_client, run_id)
    assert [(record.level, record.message) for record in records] == [
        ("INFO", "episode 3 started"), ("ERROR", "the run failed")]
    first, failure = records
    assert (first.run_id, first.logger, first.role, first.hostname, first.pid, first.traceback) == (
        run_id, "tests.run_logs.subject", "rollout_worker", socket.gethostname(), os.getpid(), "")
    assert failure.traceback.startswith("Traceback (most recent call last):")
    assert failure.traceback.endswith("ValueError: the checkpoint is corrupt")
    assert first.created <= failure.created


def test_asyncio_tasks_of_a_scope_carry_it_and_threads_carry_the_process_scope(
        redis_client, run_id, shipper_of, test_logger, clean_stream):
    other_run = run_id + 1
    clean_stream(run_id)
    clean_stream(other_run)
    shipper = shipper_of(redis_client)
    loop = asyncio.new_event_loop()
    loop_thread = threading.Thread(target=loop.run_forever, daemon=True)
    loop_thread.start()

    async def episode(index: int) -> None:
        await asyncio.sleep(0)
        test_logger.info("episode %d", index)

    async def task() -> None:
        await asyncio.gather(*(episode(index) for index in range(3)))

    try:
        # As a producer's task hands its episodes to the process's loop (workers/episode_loop.py).
        with run_log_scope(run_id):
            asyncio.run_coroutine_threadsafe(task(), loop).result(timeout=30)
        # A coroutine sent from outside any scope belongs to no run, though the loop ran the run's before.
        asyncio.run_coroutine_threadsafe(episode(99), loop).result(timeout=30)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        loop_thread.join(timeout=30)
        loop.close()
    # The trainer's hold of a run covers every thread of its process.
    with process_run_log_scope(other_run):
        helper = threading.Thread(target=lambda: test_logger.warning("from the liveness thread"))
        helper.start()
        helper.join()
    assert current_run_log_scope() is None
    shipper.flush()

    assert sorted(record.message for record in _records(redis_client, run_id)) == [
        "episode 0", "episode 1", "episode 2"]
    assert [record.message for record in _records(redis_client, other_run)] == ["from the liveness thread"]


def test_records_are_buffered_and_shipped_in_batches_off_the_logging_call(
        redis_client, run_id, shipper_of, test_logger, clean_stream):
    clean_stream(run_id)
    shipper = shipper_of(redis_client, batch_max=4)

    with run_log_scope(run_id):
        for index in range(10):
            test_logger.info("line %d", index)
    shipper.flush()

    # Batches of 4, 4 and 2 records: three round trips, every record in order.
    assert [record.message for record in _records(redis_client, run_id)] == [f"line {i}" for i in range(10)]
    assert (shipper.shipped_total, shipper.dropped_total) == (10, 0)


def test_a_full_buffer_drops_records_and_the_count_reaches_the_run(
        redis_client, run_id, shipper_of, test_logger, clean_stream, caplog):
    clean_stream(run_id)
    shipper = shipper_of(redis_client, buffer_max=3)

    with run_log_scope(run_id):
        for index in range(5):
            test_logger.info("line %d", index)
    with caplog.at_level(logging.WARNING, logger="tandem.runtime.run_logs"):
        shipper.flush()

    records = _records(redis_client, run_id)
    assert records[0].level == "WARNING" and records[0].message.startswith("2 log records of this process were dropped")
    assert [record.message for record in records[1:]] == ["line 0", "line 1", "line 2"]
    assert shipper.dropped_total == 2
    assert f"run {run_id}: 2 log records of this process were dropped" in caplog.text


def test_records_are_dropped_and_counted_while_redis_is_away_and_the_count_is_shipped_when_it_is_back(
        tmp_path, run_id, shipper_of, test_logger, caplog):
    port = free_local_port()
    client = redis.Redis(port=port, socket_timeout=2, socket_connect_timeout=2)
    shipper = shipper_of(client)

    with run_log_scope(run_id):
        for index in range(5):
            test_logger.info("while Redis is away %d", index)  # never blocks, never raises
    with caplog.at_level(logging.WARNING, logger="tandem.runtime.run_logs"):
        shipper.flush()
    assert shipper.dropped_total == 5
    assert "could not ship 5 run log records" in caplog.text

    server = start_redis_server(port, tmp_path, "--save", "")
    try:
        with run_log_scope(run_id):
            test_logger.info("Redis is back")
        shipper.flush()
        records = _records(client, run_id)
    finally:
        server.terminate()
        server.wait(timeout=30)

    assert [(record.level, record.message.split(":")[0]) for record in records] == [
        ("WARNING", "5 log records of this process were dropped"), ("INFO", "Redis is back")]
