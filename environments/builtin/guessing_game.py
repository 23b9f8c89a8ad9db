"""Built-in multi-turn task: find a hidden number from "higher"/"lower" hints.

The policy sees ``Guess 1-100.``, answers ``A:50``, reads ``higher`` or
``lower`` back, and guesses again. Finding the number pays 1, discounted by
``turn_discount`` per extra guess, so binary search (about log2(range)
guesses) beats guessing at random, and only multi-turn credit assignment
learns it.

A fifth of the hidden numbers, fixed by their hash, are held out for evaluation.
"""

from __future__ import annotations

import random
import re
from typing import Any

from environments.base import (
    Demonstration,
    DemonstrationTurn,
    Environment,
    StepResult,
    draw_from_split,
    stable_fraction,
)

#: Share of hidden numbers held out for evaluation, chosen by each number's stable hash.
EVALUATION_FRACTION = 0.2

_GUESS = re.compile(r"^\s*A:\s*(-?\d+)\s*$")


class GuessingGameEnvironment(Environment):
    def __init__(self, *, low: int = 1, high: int = 100, max_guesses: int = 10, turn_discount: float = 0.9,
                 binary_search_fraction: float = 0.7, retry_malformed: bool = False):
        """``binary_search_fraction``: share of demonstrations that bisect exactly; the rest
        guess anywhere consistent with the hints, so SFT leaves room for RL.

        ``retry_malformed``: an answer that is not ``A:<number>`` costs a guess and is
        answered with the expected format, instead of ending the episode, as
        environments that tell the agent what they expected do."""
        if low >= high:
            raise ValueError("low must be below high")
        if max_guesses < 1:
            raise ValueError("max_guesses must be at least 1")
        if not 0 < turn_discount <= 1:
            raise ValueError("turn_discount must be in (0, 1]")
        self.low, self.high = low, high
        self.max_guesses = max_guesses
        self.turn_discount = turn_discount
        self.binary_search_fraction = binary_search_fraction
        self.retry_malformed = retry_malformed
        self._target: int | None = None
        self._guesses = 0

    def _prompt(self) -> str:
        return f"Guess {self.low}-{self.high}.\n"

    @staticmethod
    def is_held_out(task: dict[str, Any]) -> bool:
        """Whether ``task``'s number is one kept for evaluation (a fifth of them)."""
        return stable_fraction(int(task["target"])) < EVALUATION_FRACTION

    def sample_task(self, rng: random.Random) -> dict[str, Any]:
        return draw_from_split(lambda: {"target": rng.randint(self.low, self.high)},
                               held_out=self.is_held_out, evaluation=False)

    def sample_evaluation_task(self, rng: random.Random) -> dict[str, Any]:
        return draw_from_split(lambda: {"target": rng.randint(self.low, self.high)},
                               held_out=self.is_held_out, evaluation=True)

    async def reset(self, task: dict[str, Any]) -> str:
        target = int(task["target"])
        if not self.low <= target <= self.high:
            raise ValueError(f"target {target} is outside {self.low}-{self.high}")
        self._target, self._guesses = target, 0
        return self._prompt()

    async def step(self, action: str) -> StepResult:
        if self._target is None:
            raise RuntimeError("step() called before reset()")
        match = _GUESS.match(action)
        if match is None:
            if not self.retry_malformed:
                return StepResult("", 0.0, True, {"outcome": "malformed guess", "guesses": self._guesses})
            self._guesses += 1
            done = self._guesses >= self.max_guesses
            return StepResult("" if done else "answer as A:<number>\n", 0.0, done,
                              {"outcome": "malformed guess", "guesses": self._guesses})
        self._guesses += 1
        guess = int(match.group(1))
        if guess == self._target:
            reward = self.turn_discount ** (self._guesses - 1)
            return StepResult("", reward, True, {"outcome": "found", "guesses": self._guesses})
        if self._guesses >= self.max_guesses:
            return StepResult("", 0.0, True, {"outcome": "out of guesses", "guesses": self._guesses})
        hint = "higher" if guess < self._target else "lower"
        return StepResult(f"{hint}\n", 0.0, False, {"outcome": hint, "guesses": self._guesses})

    def demonstrations(self, count: int, rng: random.Random) -> list[Demonstration]:
        demos = []
        for _ in range(count):
            target = self.sample_task(rng)["target"]
            bisect = rng.random() < self.binary_search_fraction
            low, high, turns = self.low, self.high, []
            for guess_index in range(self.max_guesses):
                # The imperfect demonstrator still respects the hints, it just does not halve the range.
                guess = (low + high) // 2 if bisect else rng.randint(low, high)
                turns.append(DemonstrationTurn("policy", f"A:{guess}"))
                if guess == target or guess_index == self.max_guesses - 1:
                    break
                if guess < target:
                    low = guess + 1
                    turns.append(DemonstrationTurn("environment", "higher\n"))
                else:
                    high = guess - 1
                    turns.append(DemonstrationTurn("environment", "lower\n"))
            demos.append(Demonstration(prompt=self._prompt(), turns=tuple(turns)))
        return demos
