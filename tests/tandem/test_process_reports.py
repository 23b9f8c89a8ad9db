"""The process reporter and its reader, on this test process and real Redis."""

from __future__ import annotations

import os
import socket
import time

import pytest

from tandem.contracts import ProcessReport, process_report_field, process_reports_key
from tandem.runtime.process_reports import (
    _DELETE_IF_UNCHANGED,
    ProcessReporter,
    ProcessSampler,
    TrainerDevice,
    live_process_reports,
    report_interval_s,
)

HOSTNAME = "test-host-process-reports"


def _report(pid: int, *, reported_at: float, interval_s: float = 5.0, role: str = "rollout_worker",
            **fields) -> ProcessReport:
    return ProcessReport(role=role, hostname=HOSTNAME, pid=pid, started_at=reported_at - 60,
                         reported_at=reported_at, interval_s=interval_s, cpu_cores=0.5, rss_bytes=2**28,
                         host_cpu_count=8, host_cpu_percent=20.0, host_memory_used_bytes=2**32,
                         host_memory_total_bytes=2**34, **fields)


@pytest.fixture
def clean_fields(redis_client):
    """Deletes, afterwards, the fields a test wrote to the shared hash of process reports."""
    written: list[str] = []
    yield written.append
    if written:
        redis_client.hdel(process_reports_key(), *written)


def _burn_cpu(seconds: float) -> float:
    """Spin until this process used ``seconds`` more CPU; the CPU seconds it used."""
    start = time.process_time()
    while time.process_time() - start < seconds:
        sum(range(1000))
    return time.process_time() - start


def test_cpu_cores_is_the_cpu_used_since_the_previous_report_per_wall_second():
    instants: list[float] = []

    def clock() -> float:
        instants.append(time.time())
        return instants[-1]

    sampler = ProcessSampler(role="trainer", interval_s=5.0, clock=clock)
    first = sampler.sample()
    assert first.host_cpu_percent is None  # no previous sample of the host
    assert first.pid == os.getpid() and first.hostname == socket.gethostname()

    burned = _burn_cpu(0.4)
    busy = sampler.sample()
    wall = instants[1] - instants[0]
    # psutil counts CPU in clock ticks (10 ms): the report's CPU seconds match within a few ticks.
    assert busy.cpu_cores * wall == pytest.approx(burned, abs=0.05)
    assert 0.0 <= busy.host_cpu_percent <= 100.0

    time.sleep(0.5)
    idle = sampler.sample()
    assert idle.cpu_cores < 0.1  # the rate of the last interval only, not the average since the start
    assert idle.rss_bytes > 0 and idle.host_memory_used_bytes <= idle.host_memory_total_bytes
    assert idle.started_at <= first.reported_at and idle.host_cpu_count >= 1


def test_the_run_ids_are_read_at_each_report():
    working_on = [7, 3, 7]
    sampler = ProcessSampler(role="rollout_worker", interval_s=5.0, run_ids=lambda: working_on)
    assert sampler.sample().run_ids == [3, 7]
    working_on.clear()
    assert sampler.sample().run_ids == []


def test_a_trainer_reports_its_device_memory_and_platform_and_the_others_none():
    device = TrainerDevice(memory_bytes=16 * 2**30, platform="tpu")
    trainer = ProcessSampler(role="trainer", interval_s=5.0, device=device).sample()
    worker = ProcessSampler(role="rollout_worker", interval_s=5.0).sample()
    assert (trainer.device_memory_bytes, trainer.device_platform) == (16 * 2**30, "tpu")
    assert (worker.device_memory_bytes, worker.device_platform) == (None, None)
    read = ProcessReport.model_validate_json(trainer.model_dump_json())
    assert (read.device_memory_bytes, read.device_platform) == (16 * 2**30, "tpu")
    # Reports of schemas 1 and 2, from processes of the versions before, read as ones of no device memory
    # and no platform.
    version_1 = worker.model_dump(exclude={"device_memory_bytes", "device_platform"}) | {"schema_version": 1}
    assert ProcessReport.model_validate(version_1).device_memory_bytes is None
    version_2 = trainer.model_dump(exclude={"device_platform"}) | {"schema_version": 2}
    assert ProcessReport.model_validate(version_2).device_platform is None


def test_the_reader_returns_live_reports_and_deletes_stale_ones(redis_client, clean_fields):
    now = time.time()
    live = _report(101, reported_at=now - 14)  # within 3 intervals of 5 s
    dead = _report(102, reported_at=now - 16)
    slow = _report(103, reported_at=now - 100, interval_s=60.0)  # a process that reports each minute
    for report in (live, dead, slow):
        clean_fields(report.field)
        redis_client.hset(process_reports_key(), report.field, report.model_dump_json())
    garbage = process_report_field("web", HOSTNAME, 104)
    newer = process_report_field("web", HOSTNAME, 105)
    clean_fields(garbage)
    clean_fields(newer)
    redis_client.hset(process_reports_key(), garbage, "not json")
    # A newer writer's report: unreadable here, but live; its readers need it.
    redis_client.hset(process_reports_key(), newer,
                      live.model_dump_json().replace('"schema_version":3', '"schema_version":99'))

    reports = [report for report in live_process_reports(redis_client, now=now) if report.hostname == HOSTNAME]

    assert [report.pid for report in reports] == [101, 103]
    assert reports[0] == live
    stored = redis_client.hgetall(process_reports_key())
    assert dead.field.encode() not in stored and garbage.encode() not in stored
    assert {live.field.encode(), slow.field.encode(), newer.encode()} <= set(stored)


def test_a_stale_report_is_kept_when_its_process_reported_again_before_the_prune(redis_client, clean_fields):
    stale = _report(111, reported_at=time.time() - 60)
    fresh = _report(111, reported_at=time.time())
    clean_fields(stale.field)
    redis_client.hset(process_reports_key(), stale.field, stale.model_dump_json())
    read = redis_client.hget(process_reports_key(), stale.field)
    redis_client.hset(process_reports_key(), fresh.field, fresh.model_dump_json())  # between read and prune

    prune = redis_client.register_script(_DELETE_IF_UNCHANGED)
    assert prune(keys=[process_reports_key()], args=[stale.field, read]) == 0

    assert ProcessReport.model_validate_json(redis_client.hget(process_reports_key(), fresh.field)) == fresh
    assert prune(keys=[process_reports_key()], args=[fresh.field, fresh.model_dump_json()]) == 1


def test_the_reporter_thread_reports_every_interval_and_deletes_its_report_at_stop(redis_url, redis_client):
    reporter = ProcessReporter(redis_url=redis_url, role="web", name="test", interval_s=0.2).start()
    field = reporter.sampler.field
    try:
        assert field == f"web:{socket.gethostname()}:{os.getpid()}"
        deadline = time.monotonic() + 10
        seen: list[float] = []
        while len(set(seen)) < 3:
            assert time.monotonic() < deadline, seen
            raw = redis_client.hget(process_reports_key(), field)
            if raw is not None:
                seen.append(ProcessReport.model_validate_json(raw).reported_at)
            time.sleep(0.05)
        report = ProcessReport.model_validate_json(redis_client.hget(process_reports_key(), field))
        assert (report.role, report.name, report.pid, report.interval_s) == ("web", "test", os.getpid(), 0.2)
        assert report.host_cpu_percent is not None  # not the first report any more
        assert report in live_process_reports(redis_client)
    finally:
        reporter.stop()
    assert redis_client.hget(process_reports_key(), field) is None


def test_a_reporter_without_redis_logs_and_goes_on(caplog):
    reporter = ProcessReporter(redis_url="redis://127.0.0.1:1/0", role="trainer", interval_s=0.05).start()
    time.sleep(0.3)
    assert reporter._thread.is_alive()
    reporter.stop()  # the delete fails too: logged, not raised
    warnings = [record for record in caplog.records if record.name == "tandem.runtime.process_reports"]
    # Once per outage, not once per attempt; and once for the delete at stop.
    assert [record.getMessage().split(";")[0] for record in warnings] == [
        "process report not written", "process report not deleted at stop"]


def test_the_interval_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("TANDEM_PROCESS_REPORT_INTERVAL_S", raising=False)
    assert report_interval_s() == 5.0
    monkeypatch.setenv("TANDEM_PROCESS_REPORT_INTERVAL_S", "0.5")
    assert report_interval_s() == 0.5
    monkeypatch.setenv("TANDEM_PROCESS_REPORT_INTERVAL_S", "-1")
    assert report_interval_s() == 5.0
