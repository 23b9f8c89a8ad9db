"""`tandem up` supervises its processes (issue 15, finding 7).

Before, killing the trainer with SIGKILL stopped the whole local stack, web included. Now a
crashed process is started again with backoff, the restart is logged, and the rest runs on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tandem.runtime.local_ports import free_local_port
from tests.e2e.conftest import fresh_database
from tests.polling import poll_until
from tests.redis_servers import own_redis_server


def _pids(pattern: str, *, redis_url: str | None = None) -> set[int]:
    """Processes whose command line has ``pattern`` (and, given ``redis_url``, whose REDIS_URL it is:
    another suite's stack on this host runs workers of the same command line)."""
    found = {int(pid) for pid in subprocess.run(["pgrep", "-f", "--", pattern], capture_output=True,
                                                 text=True).stdout.split()}
    if redis_url is None:
        return found
    return {pid for pid in found if f"REDIS_URL={redis_url}".encode() in _environ(pid).split(b"\0")}


def _environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def _wait(predicate, *, timeout_s: float, what: str, up: subprocess.Popen, log) -> None:
    def up_runs() -> None:
        assert up.poll() is None, f"tandem up exited ({up.returncode}):\n{log.read_text()[-3000:]}"

    poll_until(predicate, timeout_s=timeout_s, interval_s=0.2, between=up_runs,
               what=lambda: f"{what}:\n{log.read_text()[-3000:]}")


def _answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/api/", timeout=2).status_code < 500
    except httpx.TransportError:
        return False


def test_tandem_up_restarts_a_killed_trainer_and_a_crashed_web_server_while_the_rest_runs_on(tmp_path):
    port = free_local_port()
    url = f"http://127.0.0.1:{port}"
    output = tmp_path / "up.out"
    with own_redis_server(tmp_path / "redis") as redis_url, fresh_database() as database_url, \
            output.open("wb") as out:
        up = subprocess.Popen(
            [sys.executable, "-m", "tandem.cli", "up", "--port", str(port), "--workers", "1",
             "--var-dir", str(tmp_path)],
            env={**os.environ, "DATABASE_URL": database_url, "REDIS_URL": redis_url},
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
        # Each process's command line names this test's own directory or port.
        trainer_pattern = f"-m trainer --platform-url {url}"
        web_pattern = f"config.asgi:application --host 127.0.0.1 --port {port}"
        worker_pattern = "-m workers --name rollouts-0@"
        supervisor_log = tmp_path / "logs" / "supervisor.log"
        try:
            _wait(lambda: b"Tandem is up" in output.read_bytes(), timeout_s=300, what="the stack", up=up, log=output)
            (trainer,) = _pids(trainer_pattern)
            workers_before = _pids(worker_pattern, redis_url=redis_url)
            assert workers_before, "found no rollout worker of this stack"

            os.kill(trainer, signal.SIGKILL)
            _wait(lambda: _pids(trainer_pattern) - {trainer}, timeout_s=60, what="a new trainer", up=up, log=output)
            assert "trainer exited with code -9" in supervisor_log.read_text()
            assert "restarted trainer (restart 1" in supervisor_log.read_text()
            assert _answers(url), "the web server went down with the trainer"
            assert _pids(worker_pattern, redis_url=redis_url) == workers_before, "the rollout worker was restarted too"

            (web,) = _pids(web_pattern)
            os.kill(web, signal.SIGKILL)
            _wait(lambda: _answers(url) and _pids(web_pattern) - {web}, timeout_s=120, what="the web server back",
                  up=up, log=output)
            assert "restarted web (restart 1" in supervisor_log.read_text()
            assert b"web exited with code -9: restarted" in output.read_bytes()
        finally:
            up.send_signal(signal.SIGTERM)
            try:
                assert up.wait(timeout=60) == 0, output.read_text()[-3000:]
            finally:
                if up.poll() is None:
                    os.killpg(up.pid, signal.SIGKILL)
        # Stopping `tandem up` stops what it supervises, restarted processes included.
        time.sleep(1)
        assert not _pids(trainer_pattern) and not _pids(web_pattern), "processes outlived tandem up"
