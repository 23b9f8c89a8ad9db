"""Fixtures shared by every test package: real services, failing loudly when absent."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest
import redis

TEST_REDIS_URL = os.environ.get("TANDEM_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
REPO_ROOT = Path(__file__).resolve().parents[1]
#: SmolLM2-135M-Instruct as `make models` imports it (make test runs that first).
SMOLLM2_DIR = Path(os.environ.get("TANDEM_SMOLLM2_DIR", REPO_ROOT / "var/models/smollm2-135m-instruct"))


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The real instruct model's directory; fails (never skips) when it was not imported."""
    if not (SMOLLM2_DIR / ".imported").is_file():
        pytest.fail(f"{SMOLLM2_DIR} is missing: run `make models` (make test does) to import SmolLM2")
    return SMOLLM2_DIR


@pytest.fixture(scope="session")
def redis_url() -> str:
    client = redis.Redis.from_url(TEST_REDIS_URL, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.fail(f"these tests need a real Redis at {TEST_REDIS_URL}: {exc}")
    return TEST_REDIS_URL


@pytest.fixture
def redis_client(redis_url):
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def run_id() -> int:
    """A run id no other test (or an earlier test session) uses, so keys never collide."""
    return random.randint(10**8, 10**9)


#: A module outside the test allow-list that writes a marker file when imported (tests/untrusted_environment.py).
UNTRUSTED_MODULE = "tests.untrusted_environment"


@pytest.fixture
def import_marker(tmp_path, monkeypatch):
    """Where the untrusted module would leave its mark; the test fails if it was imported."""
    marker = tmp_path / "imported"
    monkeypatch.setenv("TANDEM_TEST_IMPORT_MARKER", str(marker))
    sys.modules.pop(UNTRUSTED_MODULE, None)
    yield marker
    assert not marker.exists(), "the refused module was imported"
    assert UNTRUSTED_MODULE not in sys.modules
