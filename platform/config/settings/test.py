"""Test runs: the suite's own PostgreSQL and Redis (tests/suite_services.py), fast hashing."""

import json
import os
import sys
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured


def _suite_service(name: str) -> str:
    """A service the suite started for this run; never a default, never a developer's own."""
    value = os.environ.get(name, "").strip()
    if not value:
        raise ImproperlyConfigured(
            f"{name} is not set: the tests use servers of their own, which `make test` and `make test-fast` "
            "start (tests/suite_services.py); to run pytest yourself, export the variables of the env file that "
            "`.venv/bin/python -m tests.suite_services start --owner-pid $$` prints (TANDEM_TEST_DATABASE_URL, "
            "TANDEM_TEST_REDIS_URL, TANDEM_TEST_CHANNELS_PREFIX)")
    return value


def _own_per_suite_process() -> str:
    """Give this pytest-xdist process (``make test`` runs the suite in several) services of its own.

    Its Redis database and Channels prefix (and, below, its media folder) are its own, so that one process's Celery
    workers never take another's tasks and rows with equal ids never share a key or a file. The
    processes its tests start inherit both the rewritten variables and ``PYTEST_XDIST_WORKER``,
    so this runs again there and must change nothing more. Returns the process's name ("gw0"...), or "".
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or not worker[2:].isdigit():
        return ""
    index = int(worker[2:])
    # Database 0 stays the single-process suite's; Redis has 16 by default.
    if index + 1 > 15:
        raise ImproperlyConfigured(f"{worker}: the suite's Redis has databases for 15 test processes, not more")
    base_url = _suite_service("TANDEM_TEST_REDIS_URL").rsplit("/", 1)[0]
    os.environ["TANDEM_TEST_REDIS_URL"] = f"{base_url}/{index + 1}"
    prefix = _suite_service("TANDEM_TEST_CHANNELS_PREFIX")
    if not prefix.endswith(f":{worker}"):
        os.environ["TANDEM_TEST_CHANNELS_PREFIX"] = f"{prefix}:{worker}"
    return worker


_SUITE_PROCESS = _own_per_suite_process()

# Forced, before base.py reads them: an exported DATABASE_URL or REDIS_URL (a developer's own
# stack, as the README suggests) never receives the tests' rows, Celery tasks or Channels traffic.
# Processes the tests start on the test database set TANDEM_TEST_DATABASE_URL to it.
os.environ["DATABASE_URL"] = _suite_service("TANDEM_TEST_DATABASE_URL")
os.environ["REDIS_URL"] = _suite_service("TANDEM_TEST_REDIS_URL")
# The test environments' packages, as an operator would allow a team's; workers the tests
# start inherit it. tests.untrusted_environment stays outside on purpose.
os.environ.setdefault("TANDEM_ENVIRONMENT_MODULES", "tests.workers,tests.e2e")
# The tests' MCP tool server, as an operator would list a team's (tests/workers/mcp_arithmetic_server.py).
os.environ.setdefault("TANDEM_MCP_SERVERS", json.dumps({"arithmetic": [
    sys.executable, str(Path(__file__).resolve().parents[3] / "tests" / "workers" / "mcp_arithmetic_server.py")]}))
# The tests' agent program, written against the openai client alone (tests/agents/openai_react_agent.py).
os.environ.setdefault("TANDEM_AGENT_COMMANDS", json.dumps({"react-calculator": [
    sys.executable, str(Path(__file__).resolve().parents[3] / "tests" / "agents" / "openai_react_agent.py")]}))
# Every test client comes from 127.0.0.1: the suite's deliberate bad tokens and passwords must
# not add up to a lock-out of later tests (tests/platform/test_security_throttling.py sets its own).
os.environ.setdefault("TANDEM_AUTH_FAILURES_ALLOWED", "1000000")
# Throttle counts live in Redis and key on user ids, which repeat across test databases.
os.environ.setdefault("TANDEM_TOKEN_CREATE_RATE", "1000000/hour")
# Tests queue many runs in one project; tests/platform/test_security_quotas.py sets its own caps.
os.environ.setdefault("TANDEM_MAX_ACTIVE_RUNS_PER_PROJECT", "1000")
# The per-URL webhook rate is counted in Redis across tests, which post to the same receiver URLs
# within a minute; tests/platform/test_alerts_limits.py sets its own rate.
os.environ.setdefault("TANDEM_WEBHOOK_POSTS_PER_URL_PER_MINUTE", "1000000")

# Environment secret settings at rest (tandem/runtime/secrets_at_rest.py): a key of the tests' own, which
# the workers they start inherit. tests/platform/test_security_secrets_at_rest.py rotates it.
os.environ.setdefault("TANDEM_SECRETS_KEY", "2oxsZdxvfyLBjUXpN9musegS2L3dffRtiyP6uzWvPzg=")

from .base import *  # noqa: E402,F403

SECRET_KEY = "test-secret-key"
# Hashing with PBKDF2 would dominate the run time of tests that create users.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
ALLOWED_HOSTS = ["*"]
# A Channels prefix of the run's own, shared by the processes it starts (they inherit the variable).
CHANNEL_LAYERS["default"]["CONFIG"]["prefix"] = _suite_service("TANDEM_TEST_CHANNELS_PREFIX")  # noqa: F405
# Not through TANDEM_MEDIA_ROOT: the stacks the end-to-end tests start would inherit it instead of their own.
if _SUITE_PROCESS and not os.environ.get("TANDEM_MEDIA_ROOT"):
    MEDIA_ROOT = MEDIA_ROOT / _SUITE_PROCESS  # noqa: F405
