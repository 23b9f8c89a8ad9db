"""A task environment with no tools of its own: a sum to answer, for the MCP server's ``add``."""

from __future__ import annotations

import random

from environments import Environment, StepResult


class SumTask(Environment):
    def sample_task(self, rng: random.Random) -> dict:
        return {"a": rng.randint(100, 999), "b": rng.randint(100, 999)}

    async def reset(self, task: dict) -> str:
        self._answer = task["a"] + task["b"]
        return f"What is {task['a']}+{task['b']}? Use the add tool, then answer with the number."

    async def step(self, action: str) -> StepResult:
        return StepResult(observation="", reward=float(action.strip() == str(self._answer)), done=True)
