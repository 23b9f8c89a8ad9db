"""Environments as a team might already have them: plain classes that never import Tandem."""

from __future__ import annotations

import random

CLOSED: list[str] = []  # episodes closed in this process, for the tests


class TupleCountdown:
    """``step`` answers an (observation, reward, done, info) tuple, as Gym-style code does."""

    def __init__(self, start: int = 2):
        self.start = start

    def sample_task(self, rng: random.Random) -> dict:
        return {"start": self.start + rng.randrange(2)}

    async def reset(self, task: dict) -> str:
        self.left = task["start"]
        return f"count down from {self.left}\n"

    async def step(self, action: str):
        self.left -= 1
        return f"{self.left}\n", 0.5, self.left <= 0, {"left": self.left}

    async def close(self) -> None:
        CLOSED.append(type(self).__name__)


class MappingEcho:
    """``step`` answers a mapping; ``close`` is synchronous."""

    def sample_task(self, rng: random.Random) -> dict:
        return {}

    async def reset(self, task: dict) -> str:
        return "say anything\n"

    async def step(self, action: str) -> dict:
        return {"observation": "", "reward": 1.0, "done": True}

    def close(self) -> None:
        CLOSED.append(type(self).__name__)


class ListAnswer(MappingEcho):
    async def step(self, action: str) -> list:
        return ["", 1.0, True]


class SynchronousStep:
    def sample_task(self, rng: random.Random) -> dict:
        return {}

    async def reset(self, task: dict) -> str:
        return "hello\n"

    def step(self, action: str):
        return "", 0.0, True, {}
