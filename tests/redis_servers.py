"""redis-server processes of a test's own (a restart, an ACL file), on a free loopback port."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import redis

from tandem.runtime.local_ports import free_local_port
from tests.polling import poll_until
from tests.processes import stop_process

# What a test restarting Redis needs of it: every write on disk before it is acknowledged.
PERSISTENT = ("--appendonly", "yes", "--appendfsync", "always", "--save", "", "--maxmemory-policy", "noeviction")


def start_redis_server(port: int, directory: Path, *options: str,
                       ready: Callable[[], object] | None = None) -> subprocess.Popen:
    """redis-server on 127.0.0.1:``port`` with its files in ``directory``, once ``ready()`` (a ping) answers.

    Its output goes to ``directory/redis.log``, shown if it exits before it is ready.
    """
    log = directory / "redis.log"
    with log.open("ab") as output:
        process = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                                    "--dir", str(directory), *options], stdout=output, stderr=subprocess.STDOUT)

    def alive() -> None:
        assert process.poll() is None, f"redis-server exited:\n{log.read_text(errors='replace')}"

    # BusyLoadingError (still reading its append-only file) is a ConnectionError too.
    poll_until(ready or (lambda: redis.Redis(port=port, socket_connect_timeout=1).ping()), timeout_s=30,
               interval_s=0.05, between=alive, ignoring=(redis.ConnectionError,), what=f"redis-server on port {port}")
    return process


#: A Redis that forgets everything when it stops: a stack's or a test's scratch Redis.
EPHEMERAL = ("--save", "", "--appendonly", "no")


@contextlib.contextmanager
def own_redis_server(directory: Path) -> Iterator[str]:
    """A redis-server of the caller's own on a free port (nothing else uses it); yields its URL.

    Stopped (and killed, if it does not stop) when the block ends, a failed one too.
    """
    directory.mkdir(parents=True, exist_ok=True)
    port = free_local_port()
    process = start_redis_server(port, directory, *EPHEMERAL)
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        stop_process(process, grace_s=30)
