"""`tandem up` finds Redis, or starts a local redis-server when none listens."""

from pathlib import Path

import redis

from tandem.cli.local_redis import ensure_redis, redis_is_up
from tandem.runtime.local_ports import free_local_port


def test_a_running_redis_is_used_as_it_is(redis_url, tmp_path: Path):
    assert ensure_redis(redis_url, log_path=str(tmp_path / "redis.log")) is None


def test_a_local_redis_server_is_started_when_none_listens(tmp_path: Path):
    url = f"redis://127.0.0.1:{free_local_port()}/0"
    assert not redis_is_up(url)
    process = ensure_redis(url, log_path=str(tmp_path / "redis.log"))
    try:
        assert process is not None
        assert redis.Redis.from_url(url).ping()
    finally:
        process.terminate()
        process.wait(timeout=10)
    assert not redis_is_up(url)
