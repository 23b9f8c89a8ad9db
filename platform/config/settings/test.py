"""Test runs: PostgreSQL and a Redis database of their own, fast hashing."""

import os

# Set before base.py reads them: tests use the real services, on a Redis
# database of their own so that test traffic never reaches a dev server's layer.
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/15")
# The test environments' packages, as an operator would allow a team's; workers the tests
# start inherit it. tests.untrusted_environment stays outside on purpose.
os.environ.setdefault("TANDEM_ENVIRONMENT_MODULES", "tests.workers,tests.e2e")
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
