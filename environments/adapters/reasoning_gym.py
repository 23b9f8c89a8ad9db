"""Procedural reasoning tasks from reasoning-gym (``pip install reasoning-gym``), scored by the dataset.

A task is an index into a dataset built from ``(dataset, size, seed,
dataset_kwargs)``, so every producer process builds the same questions and a
group shares one. The policy's answer is the text inside ``<answer>...</answer>``
if present, else what follows ``A:``, else the whole turn; the dataset's own
``score_answer`` gives the reward in [0, 1].

With ``max_attempts > 1`` the episode is multi-turn: an answer that does not
score 1 is told so and may be retried; the final reward is the last score,
discounted by ``attempt_discount`` per extra attempt.
"""

from __future__ import annotations

import functools
import json
import random
import re
from typing import Any

from environments.base import (
    EVALUATION_SEED_BASE,
    Demonstration,
    DemonstrationTurn,
    Environment,
    StepResult,
)

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ANSWER_PREFIX = re.compile(r"^\s*A:\s*(.*?)\s*$", re.DOTALL)


@functools.lru_cache(maxsize=16)
def _dataset(name: str, size: int, seed: int, kwargs_json: str):
    # Building a dataset can take seconds; producers create one environment per episode.
    import reasoning_gym

    return reasoning_gym.create_dataset(name, size=size, seed=seed, **json.loads(kwargs_json))


def extract_answer(text: str) -> str:
    tagged = _ANSWER_TAG.findall(text)
    if tagged:
        return tagged[-1].strip()
    prefixed = _ANSWER_PREFIX.match(text)
    return prefixed.group(1) if prefixed else text.strip()


class ReasoningGymEnvironment(Environment):
    """Registration: entrypoint ``environments.adapters.reasoning_gym:ReasoningGymEnvironment``,
    settings ``{"dataset": "basic_arithmetic", "size": 1000, "seed": 0, "dataset_kwargs": {},
    "max_attempts": 1, "attempt_discount": 0.8}``."""

    def __init__(self, *, dataset: str, size: int = 1000, seed: int = 0,
                 dataset_kwargs: dict[str, Any] | None = None, max_attempts: int = 1,
                 attempt_discount: float = 0.8, instruction: str = "Answer as A:<answer>.\n"):
        if size < 1 or max_attempts < 1 or not 0 < attempt_discount <= 1:
            raise ValueError("size and max_attempts must be positive, attempt_discount in (0, 1]")
        kwargs_json = json.dumps(dataset_kwargs or {}, sort_keys=True)
        self.dataset = _dataset(dataset, size, seed, kwargs_json)
        # Built when an evaluation first asks for it: another seed of reasoning-gym's own.
        self._evaluation_dataset = functools.partial(_dataset, dataset, size, seed + EVALUATION_SEED_BASE,
                                                     kwargs_json)
        self.size = size
        self.max_attempts = max_attempts
        self.attempt_discount = attempt_discount
        self.instruction = instruction
        self._entry: dict[str, Any] | None = None
        self._attempts = 0

    def sample_task(self, rng: random.Random) -> dict[str, Any]:
        return {"index": rng.randrange(self.size)}

    def sample_evaluation_task(self, rng: random.Random) -> dict[str, Any]:
        """An entry of the same task generated from another seed: reasoning-gym's held-out set."""
        return {"index": rng.randrange(self.size), "split": "evaluation"}

    def _prompt(self, entry: dict[str, Any]) -> str:
        return f"{entry['question']}\n{self.instruction}"

    async def reset(self, task: dict[str, Any]) -> str:
        dataset = self._evaluation_dataset() if task.get("split") == "evaluation" else self.dataset
        self._entry = dataset[int(task["index"])]
        self._attempts = 0
        return self._prompt(self._entry)

    async def step(self, action: str) -> StepResult:
        if self._entry is None:
            raise RuntimeError("step() called before reset()")
        self._attempts += 1
        answer = extract_answer(action)
        score = float(self.dataset.score_answer(answer, self._entry) or 0.0)
        info = {"score": score, "attempts": self._attempts, "answer": answer}
        if score >= 1.0 or self._attempts >= self.max_attempts:
            return StepResult("", score * self.attempt_discount ** (self._attempts - 1), True, info)
        left = self.max_attempts - self._attempts
        return StepResult(f"Incorrect. {left} attempt{'s' if left > 1 else ''} left.\n", 0.0, False, info)

    def demonstrations(self, count: int, rng: random.Random) -> list[Demonstration]:
        demos = []
        for _ in range(count):
            entry = self.dataset[self.sample_task(rng)["index"]]
            turn = DemonstrationTurn("policy", f"A:{entry['answer']}")
            demos.append(Demonstration(prompt=self._prompt(entry), turns=(turn,)))
        return demos
