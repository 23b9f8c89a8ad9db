"""Fixtures shared by every test package: real services, failing loudly when absent.

The services are the suite's own, never a developer's or the system's: `make test` (and
`make test-fast`) start a redis-server and a PostgreSQL cluster for the run (tests/suite_services.py)
and export ``TANDEM_TEST_REDIS_URL``, ``TANDEM_TEST_DATABASE_URL`` and ``TANDEM_TEST_CHANNELS_PREFIX``;
to run pytest by hand, start them the same way and export that env file's variables::

    env_file=$(.venv/bin/python -m tests.suite_services start --owner-pid $$)
    set -a; . "$env_file"; set +a
    .venv/bin/pytest tests/tandem
    .venv/bin/python -m tests.suite_services stop "$env_file"

End-to-end stacks start a redis-server of their own each (tests/redis_servers.py) and a database
each in the suite's PostgreSQL.

Markers, put on by directory and fixture here (never by hand): ``e2e`` (tests/e2e), ``browser``
(Chromium, found by `launch_chromium` in the test or its fixtures), ``multihost``
(tests/e2e/test_multi_host.py), ``real_model`` (the ``smollm2`` fixture). `make test-fast` runs
the rest.
"""

from __future__ import annotations

import functools
import inspect
import os
import random
import sys
from pathlib import Path

import pytest
import redis

TEST_REDIS_URL = os.environ.get("TANDEM_TEST_REDIS_URL", "")
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
    if not TEST_REDIS_URL:
        pytest.fail("these tests need the suite's Redis: TANDEM_TEST_REDIS_URL is not set "
                    "(`make test` sets it; see tests/conftest.py)")
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


TESTS_DIR = Path(__file__).resolve().parent
#: What makes a test a browser test, in its own source or a fixture's it uses.
BROWSER_CALL = "launch_chromium("


def _drives_a_browser(item: pytest.Item) -> bool:
    functions = [getattr(item, "function", None)]
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    functions += [definition.func for name in item.fixturenames for definition in definitions.get(name, ())]
    return any(BROWSER_CALL in _source(function) for function in functions if function is not None)


@functools.cache
def _source(function) -> str:
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        return ""


def pytest_collection_modifyitems(config, items):
    """The suite's markers (registered in pyproject.toml), put on by where a test lives and what it uses."""
    for item in items:
        path = Path(str(item.path)).resolve()
        if TESTS_DIR / "e2e" in path.parents:
            item.add_marker(pytest.mark.e2e)
        if path == TESTS_DIR / "e2e" / "test_multi_host.py":
            item.add_marker(pytest.mark.multihost)
        if "smollm2" in item.fixturenames:
            item.add_marker(pytest.mark.real_model)
        if _drives_a_browser(item):
            item.add_marker(pytest.mark.browser)
