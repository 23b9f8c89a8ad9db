"""Environments that need a secret setting, as one calling a paid API does; imported by workers by entrypoint.

No Django and no pytest here: a rollout worker imports this module.
"""

from __future__ import annotations

import json
import random
import urllib.parse
from typing import Any

from environments.base import Environment, StepResult

# What a registration sends as its secret setting; tests look for it in everything a user can read.
API_KEY = "sk-test-3f9c1e7a-not-a-real-key"


class KeyedEnvironment(Environment):
    """Cannot be built without ``api_key``; rewards 1 only when it was given the right one."""

    def __init__(self, *, api_key: str, greeting: str = "hello"):
        self.api_key = api_key
        self.greeting = greeting

    def sample_task(self, rng: random.Random) -> dict[str, Any]:
        return {}

    async def reset(self, task: dict[str, Any]) -> str:
        return f"{self.greeting}\n"

    async def step(self, action: str) -> StepResult:
        return StepResult("", 1.0 if self.api_key == API_KEY else 0.0, True)


class KeyQuotingEnvironment(KeyedEnvironment):
    """Fails every step with an error that quotes its key, as an API client's error may."""

    async def step(self, action: str) -> StepResult:
        raise RuntimeError(f"the upstream API refused key {self.api_key}")


class EvaluationKeyQuotingEnvironment(KeyedEnvironment):
    """Cannot draw a held-out task: its error quotes its key, so the whole evaluation slice fails."""

    def sample_evaluation_task(self, rng: random.Random) -> dict[str, Any]:
        raise RuntimeError(f"the task API refused key {self.api_key}")


# A JSON service-account key, as a Google client is given: quotes, newlines and backslashes,
# which repr(), json.dumps() and URL-quoting each write differently from the raw value.
SERVICE_ACCOUNT_KEY_BODY = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7testkeybody"
SERVICE_ACCOUNT_KEY = json.dumps({
    "type": "service_account",
    "private_key_id": "0123456789abcdef",
    "private_key": f"-----BEGIN PRIVATE KEY-----\n{SERVICE_ACCOUNT_KEY_BODY}\n-----END PRIVATE KEY-----\n",
    "client_email": "tandem@example.iam.gserviceaccount.com",
    "note": "it's C:\\keys\\tandem",
}, indent=2)


class KeyEchoingEnvironment(KeyedEnvironment):
    """Fails every step with an error that echoes its key as client libraries do: repr, JSON, a URL."""

    async def step(self, action: str) -> StepResult:
        raise RuntimeError(
            f"credentials {self.api_key!r} refused; request body {json.dumps({'credentials': self.api_key})}; "
            f"retry https://auth.example/token?key={urllib.parse.quote(self.api_key, safe='')}"
        )
