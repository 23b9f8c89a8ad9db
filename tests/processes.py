"""Stopping the processes a test started: asked first, killed if they do not go."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable


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
