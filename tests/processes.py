"""Stopping the processes a test started: asked first, killed if they do not go."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

from tests.polling import poll_until

#: What a Celery worker's log says once it consumes its queues ("<hostname> ready.").
CELERY_READY = b" ready."


def stop_processes(processes: Iterable[subprocess.Popen], *, grace_s: float = 10) -> None:
    """SIGTERM every one of ``processes`` at once, then wait for each; one still running ``grace_s``
    after its turn came is killed (a graceful shutdown can outlast a test on a loaded machine)."""
    processes = list(processes)
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def stop_process(process: subprocess.Popen, *, grace_s: float = 10) -> None:
    """:func:`stop_processes` for one."""
    stop_processes([process], grace_s=grace_s)


def wait_for_celery_ready(process: subprocess.Popen, log: Path, *, timeout_s: float) -> None:
    """Until the Celery worker ``process`` says in ``log`` that it is ready; the test fails with the log's
    tail if the process exits first or the bound passes (a stuck process, not a measure of speed)."""
    def tail() -> str:
        return log.read_text(errors="replace")[-3000:]

    poll_until(lambda: CELERY_READY in log.read_bytes(), timeout_s=timeout_s, interval_s=0.2, what=tail,
               between=lambda: process.poll() is None or pytest.fail(f"{log.name}: the process exited\n{tail()}"))
