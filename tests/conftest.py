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
(tests/e2e/test_multi_host.py), ``real_model`` (the ``smollm2`` and ``gemma3`` fixtures). `make test-fast` runs
the rest.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import inspect
import math
import os
import random
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from xdist.scheduler import LoadScopeScheduling

REPO_ROOT = Path(__file__).resolve().parents[1]
#: SmolLM2-135M-Instruct as `make models` imports it (make test runs that first).
SMOLLM2_DIR = Path(os.environ.get("TANDEM_SMOLLM2_DIR", REPO_ROOT / "var/models/smollm2-135m-instruct"))
#: Google's pretrained Gemma 3 270M, with Gemma's turn format, as `make models` imports it.
GEMMA3_DIR = Path(os.environ.get("TANDEM_GEMMA3_DIR", REPO_ROOT / "var/models/gemma3-270m"))


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The real instruct model's directory; fails (never skips) when it was not imported."""
    if not (SMOLLM2_DIR / ".imported").is_file():
        pytest.fail(f"{SMOLLM2_DIR} is missing: run `make models` (make test does) to import SmolLM2")
    return SMOLLM2_DIR


@pytest.fixture(scope="session")
def gemma3() -> Path:
    """The real Gemma 3 270M base model's directory; fails (never skips) when it was not imported."""
    if not (GEMMA3_DIR / ".imported").is_file():
        pytest.fail(f"{GEMMA3_DIR} is missing: run `make models` (make test does) to import Gemma 3 270M")
    return GEMMA3_DIR


@pytest.fixture(scope="session")
def redis_url() -> str:
    # Read now, not at import: config.settings.test gives each pytest-xdist process a database of its own.
    url = os.environ.get("TANDEM_TEST_REDIS_URL", "")
    if not url:
        pytest.fail("these tests need the suite's Redis: TANDEM_TEST_REDIS_URL is not set "
                    "(`make test` sets it; see tests/conftest.py)")
    client = redis.Redis.from_url(url, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as exc:
        pytest.fail(f"these tests need a real Redis at {url}: {exc}")
    return url


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
#: What makes a test one of a marker's: a call in its own source, a fixture's it uses, or a helper
#: of its module that either calls (followed two calls deep).
MARKER_CALLS = {"browser": "launch_chromium(", "multihost": "multi_host_stack("}
CALLED_NAME = re.compile(r"\b([A-Za-z_]\w*)\(")


def _reached_sources(item: pytest.Item, depth: int = 2) -> list[str]:
    functions = [getattr(item, "function", None)]
    definitions = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    functions += [definition.func for name in item.fixturenames for definition in definitions.get(name, ())]
    module = getattr(item, "module", None)
    sources = [_source(function) for function in functions if function is not None]
    frontier = sources
    for _ in range(depth):
        helpers = {getattr(module, name, None) for source in frontier for name in CALLED_NAME.findall(source)}
        frontier = [_source(helper) for helper in helpers
                    if inspect.isfunction(helper) and getattr(helper, "__module__", None) == module.__name__]
        sources += frontier
    return sources


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
        if "smollm2" in item.fixturenames or "gemma3" in item.fixturenames:
            item.add_marker(pytest.mark.real_model)
        sources = _reached_sources(item)
        for marker, call in MARKER_CALLS.items():
            if any(call in source for source in sources):
                item.add_marker(getattr(pytest.mark, marker))


#: One real-model test at a time on a host, whichever suite runs it: a SmolLM2 stack holds about
#: 10 GB (its trainer 6.5 GB, its producers' engines), and when two suites ran theirs at once on a
#: 24 GB machine, the kernel killed both stacks' trainers. Another suite's test holds the lock for
#: at most its own timeout.
REAL_MODEL_LOCK = Path(tempfile.gettempdir()) / "tandem-tests-real-model.lock"
REAL_MODEL_LOCK_WAIT_S = 3600


def _took_lock(handle) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def _host_wide_lock(path: Path, *, wait_s: float, item: pytest.Item, interval_s: float = 1.0) -> Iterator[None]:
    """Holds ``path``'s lock (flock: released if this process dies) for the block; tried a bounded number
    of times, about ``wait_s`` long, as tests/polling.py waits; without it, runs the block anyway, saying so."""
    with path.open("a") as handle:
        for _ in range(max(1, math.ceil(wait_s / interval_s))):
            if locked := _took_lock(handle):
                break
            time.sleep(interval_s)
        else:
            item.config.get_terminal_writer().line(
                f"\n{item.nodeid}: another suite held {path} for about {wait_s:.0f} s; running without it")
        try:
            yield
        finally:
            if locked:
                fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """A real-model test takes the host's real-model lock around its whole protocol, outside
    pytest-timeout's timer: the wait for another suite is not the test's own time."""
    if item.get_closest_marker("real_model") is None:
        yield
        return
    with _host_wide_lock(REAL_MODEL_LOCK, wait_s=REAL_MODEL_LOCK_WAIT_S, item=item):
        yield


class _FilesWithTheStacksInTurn(LoadScopeScheduling):
    """``--dist loadfile``, except that every ``tests/e2e`` file is one unit of work.

    Each end-to-end test starts a whole stack (web, platform workers, producers, a trainer: a dozen
    processes importing JAX or Django); two at once on a two-core machine slowed the other pytest
    process's own worker processes past their bounds. So they take turns in one pytest process while
    the other runs the rest of the suite. (``xdist_group`` marks would say the same, but pytest-xdist
    3.8's ``--dist loadgroup`` no longer sees them under pytest 9: its node id suffix goes nowhere.)
    """

    def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        return "tests/e2e" if path.startswith("tests/e2e/") else path


def pytest_xdist_make_scheduler(config, log):
    """The suite's own scheduler for ``--dist loadfile`` (``make test``); xdist's for any other mode."""
    if config.getvalue("dist") == "loadfile":
        return _FilesWithTheStacksInTurn(config, log)
    return None
