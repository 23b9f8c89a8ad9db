"""A real rollout worker process (`tandem worker`) reports itself, and its report goes when it does."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tandem.contracts import ProcessReport, process_report_field, process_reports_key
from tandem.runtime.process_reports import live_process_reports

REPO_ROOT = Path(__file__).resolve().parents[2]
INTERVAL_S = 0.5
# A worker imports JAX before it is ready; the machine may be busy.
START_TIMEOUT_S = 120


@pytest.fixture
def start_worker(redis_url, tmp_path):
    """``start(name)``: a `tandem worker` on a queue of its own (it takes no one else's tasks)."""
    started: list[subprocess.Popen] = []

    def start(name: str) -> subprocess.Popen:
        env = {**os.environ, "REDIS_URL": redis_url, "PYTHONPATH": str(REPO_ROOT),
               "TANDEM_PROCESS_REPORT_INTERVAL_S": str(INTERVAL_S)}
        # As on a producer host: no Django (Celery would load its fixup for pytest-django's settings).
        env.pop("DJANGO_SETTINGS_MODULE", None)
        log = open(tmp_path / f"{name}.log", "wb")  # noqa: SIM115 - lives as long as the process
        process = subprocess.Popen(
            [sys.executable, "-m", "tandem.cli", "worker", "--queues", f"process-report-test-{os.getpid()}",
             "--concurrency", "1", "--name", f"{name}@%h"],
            cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
        )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait()
    for log in tmp_path.glob("*.log"):
        print(f"==== {log.name} ====\n{log.read_text(errors='replace')[-3000:]}")


def _wait_for(condition, *, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out after {timeout_s}s waiting for {what}"
        time.sleep(0.1)


def test_a_rollout_worker_reports_itself_until_it_stops(start_worker, redis_client):
    worker = start_worker("process-report-a")
    field = process_report_field("rollout_worker", socket.gethostname(), worker.pid)

    raw = _wait_for(lambda: redis_client.hget(process_reports_key(), field), timeout_s=START_TIMEOUT_S,
                    what="the worker's first report")
    first = ProcessReport.model_validate_json(raw)
    assert (first.role, first.pid, first.name) == ("rollout_worker", worker.pid, f"process-report-a@{socket.gethostname()}")
    assert first.run_ids == []  # idle: no rollout task running
    assert first.rss_bytes > 50 * 2**20  # a Python process with Celery (and JAX) loaded
    # Reports keep coming while it lives, each with a rate over the last interval.
    later = _wait_for(
        lambda: [report for report in live_process_reports(redis_client)
                 if report.pid == worker.pid and report.reported_at > first.reported_at + INTERVAL_S],
        timeout_s=10, what="a later report")[0]
    assert later.host_cpu_percent is not None and 0 <= later.cpu_cores < later.host_cpu_count

    worker.send_signal(signal.SIGTERM)  # Celery's warm shutdown: the worker deletes its own report
    assert worker.wait(timeout=60) == 0
    assert redis_client.hget(process_reports_key(), field) is None


def test_a_killed_workers_report_is_pruned_once_stale(start_worker, redis_client):
    worker = start_worker("process-report-b")
    field = process_report_field("rollout_worker", socket.gethostname(), worker.pid)
    _wait_for(lambda: redis_client.hget(process_reports_key(), field), timeout_s=START_TIMEOUT_S,
              what="the worker's first report")

    worker.send_signal(signal.SIGKILL)  # no chance to clean up
    worker.wait()
    assert redis_client.hget(process_reports_key(), field) is not None
    assert any(report.pid == worker.pid for report in live_process_reports(redis_client))  # not stale yet

    time.sleep(3 * INTERVAL_S + 0.2)
    assert all(report.pid != worker.pid for report in live_process_reports(redis_client))
    assert redis_client.hget(process_reports_key(), field) is None  # the reader deleted it
