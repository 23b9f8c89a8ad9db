"""Finding the Redis Tandem needs, or starting a local redis-server when none answers (`tandem up`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from urllib.parse import urlparse

import redis

LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}


class ServiceUnavailableError(RuntimeError):
    pass


def redis_is_up(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


def _install_redis_server() -> str:
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ServiceUnavailableError(
            "redis-server is not installed. Install it with `sudo apt-get install redis-server` "
            "(Debian/Ubuntu), or point REDIS_URL at a running Redis."
        )
    print("redis-server is missing; installing Debian's redis-server ...", flush=True)
    subprocess.run(["apt-get", "update", "-q"], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["apt-get", "install", "-y", "-q", "redis-server"], check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    executable = shutil.which("redis-server")
    if executable is None:
        raise ServiceUnavailableError("apt-get installed redis-server but it is not on PATH")
    return executable


def ensure_redis(url: str, *, log_path: str) -> subprocess.Popen | None:
    """Use the Redis at ``url``; start a local one if none listens there.

    Returns the started process (the caller stops it), or None when Redis was
    already running.
    """
    if redis_is_up(url):
        return None
    parsed = urlparse(url)
    if parsed.hostname not in LOCAL_HOSTS:
        raise ServiceUnavailableError(f"no Redis answers at {url}, and it is not local, so it is not started here")
    executable = shutil.which("redis-server") or _install_redis_server()
    port = str(parsed.port or 6379)
    process = subprocess.Popen(
        [executable, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--logfile", log_path],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if redis_is_up(url):
            return process
        if process.poll() is not None:
            raise ServiceUnavailableError(f"redis-server exited with {process.returncode}; see {log_path}")
        time.sleep(0.1)
    process.terminate()
    raise ServiceUnavailableError(f"redis-server did not answer at {url} within 15s; see {log_path}")
