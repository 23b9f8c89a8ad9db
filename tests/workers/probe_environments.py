"""Environments that misbehave, for the probe's tests; imported by worker processes by entrypoint.

No Django and no pytest here: a rollout worker imports this module.
"""

from __future__ import annotations

import random
import time
from typing import Any

from environments.base import Environment, StepResult


class BrokenStepEnvironment(Environment):
    """Resets fine, then crashes on any action it cannot parse."""

    def sample_task(self, rng: random.Random) -> dict[str, Any]:
        return {"n": rng.randint(1, 9)}

    async def reset(self, task: dict[str, Any]) -> str:
        return f"Say {task['n']}.\n"

    async def step(self, action: str) -> StepResult:
        return StepResult("", float(int(action)), True)  # int("") raises ValueError


class WrongRewardEnvironment(BrokenStepEnvironment):
    async def step(self, action: str) -> StepResult:
        return StepResult("", "1.0", True)  # a string reward breaks the loss


class BlockingResetEnvironment(BrokenStepEnvironment):
    """Blocks the event loop in reset, as synchronous client code does."""

    def __init__(self, *, block_s: float = 30.0):
        self.block_s = block_s

    async def reset(self, task: dict[str, Any]) -> str:
        time.sleep(self.block_s)
        return "late\n"


class VerboseEnvironment(Environment):
    """Works, but its prompt and feedback are long: ``chars`` characters each."""

    def __init__(self, *, chars: int = 600):
        self.chars = chars

    def sample_task(self, rng: random.Random) -> dict[str, Any]:
        return {}

    async def reset(self, task: dict[str, Any]) -> str:
        return "Read this carefully. " * (self.chars // 21) + "\n"

    async def step(self, action: str) -> StepResult:
        return StepResult("Not yet; " * (self.chars // 9), 0.0, False)
