"""Environments for the SFT demonstration tests of a whole run.

This module says in Redis which process imported it (``IMPORTERS_KEY``, one
pid per import), so a test can prove that the trainer never did: the
demonstrations of an SFT run come from the producers.
"""

from __future__ import annotations

import os
import random

import redis

from environments import Demonstration, DemonstrationTurn, Environment, StepResult

IMPORTERS_KEY = "tandem-test:demonstration_environments:importers"

if os.environ.get("REDIS_URL"):
    _client = redis.Redis.from_url(os.environ["REDIS_URL"])
    _client.rpush(IMPORTERS_KEY, os.getpid())
    _client.close()


class EchoEnvironment(Environment):
    """Asks for a word back; the demonstrations answer it."""

    def sample_task(self, rng: random.Random) -> dict:
        return {"word": rng.choice(("red", "green", "blue"))}

    async def reset(self, task: dict) -> str:
        self.word = task["word"]
        return f"say {self.word}\n"

    async def step(self, action: str) -> StepResult:
        return StepResult(observation="", reward=float(action.strip() == self.word), done=True)

    def demonstrations(self, count: int, rng: random.Random) -> list[Demonstration]:
        words = [self.sample_task(rng)["word"] for _ in range(count)]
        return [Demonstration(prompt=f"say {word}\n", turns=(DemonstrationTurn("policy", word),)) for word in words]


class BrokenDemonstratorEnvironment(EchoEnvironment):
    """Healthy episodes, and demonstrations that raise for a batch larger than the two the
    registration probe asks for: the probe passes, the SFT phase meets the error."""

    def demonstrations(self, count: int, rng: random.Random) -> list[Demonstration]:
        if count <= 2:
            return [Demonstration(prompt="say hi\n", turns=(DemonstrationTurn("policy", "hi"),)) for _ in range(count)]
        raise RuntimeError("the demonstrator is broken")
