"""An in-process environment that misbehaves on its second step, for the whole-run fault test.

The registration probe takes one step, so it sees a healthy environment and
the run starts; episodes go further and meet the fault their task names.
"""

from __future__ import annotations

import asyncio
import random

from environments import Environment, StepResult

FAULTS = ("raise", "hang", "garbage", "oversized")
# Two in three groups are healthy, so the circuit breaker (five failed episodes in a row) rarely
# opens and healthy episodes run beside the faulty ones.
TASKS = (*FAULTS, *("none",) * 8)


class SecondStepFaultEnvironment(Environment):
    def sample_task(self, rng: random.Random) -> dict:
        return {"fault": rng.choice(TASKS)}

    async def reset(self, task: dict) -> str:
        self.fault, self.steps = task["fault"], 0
        return "say two things\n"

    async def step(self, action: str):
        self.steps += 1
        if self.steps == 1:
            return StepResult(observation="and again\n", reward=0.0, done=False)
        if self.fault == "raise":
            raise RuntimeError("the environment broke")
        if self.fault == "hang":
            await asyncio.sleep(3600)
        if self.fault == "garbage":
            return {"reward": "lots"}
        if self.fault == "oversized":
            return StepResult(observation="x" * 20_000, reward=1.0, done=True)
        return StepResult(observation="", reward=1.0, done=True)
