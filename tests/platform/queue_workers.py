"""A real platform Celery worker of one queue, on the test database, as `tandem platform-worker
--queues <queue>` runs it (prefork) in a stack."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from django.db import connection

from tests.processes import stop_process, wait_for_celery_ready

REPO_ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def platform_queue_worker(queue: str, *, log: Path, env: Mapping[str, str] = {},
                          ready_timeout_s: float = 60) -> Iterator[subprocess.Popen]:
    """A prefork worker of ``queue`` with one child, ready; ``env`` adds to its environment.

    The worker's log is printed at the end (pytest shows it when the test fails).
    """
    db = connection.settings_dict
    worker_env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "TANDEM_TEST_DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "PYTHONPATH": str(REPO_ROOT),
        **env,
    }
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "tandem.cli", "platform-worker", "--queues", queue, "--pool", "prefork",
             "--concurrency", "1", "--no-beat", "--name", f"{queue}-test-{os.getpid()}@%h"],
            cwd=REPO_ROOT, env=worker_env, stdout=log_file, stderr=subprocess.STDOUT,
        )
    try:
        wait_for_celery_ready(process, log, timeout_s=ready_timeout_s)
        yield process
    finally:
        stop_process(process, grace_s=20)
        print(log.read_text()[-4000:])
