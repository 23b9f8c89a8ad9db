"""Environments whose demonstrations misbehave, for the demonstration producer's tests."""

from __future__ import annotations

from environments import Demonstration, DemonstrationTurn
from environments.builtin.calculator import CalculatorEnvironment
from tests.workers.secret_environments import API_KEY, KeyedEnvironment


class RaisingDemonstrationsEnvironment(CalculatorEnvironment):
    def demonstrations(self, count, rng):
        raise RuntimeError("the demonstrator is broken")


class NoDemonstrationsEnvironment(CalculatorEnvironment):
    def demonstrations(self, count, rng):
        return []


class KeyedDemonstrationsEnvironment(KeyedEnvironment):
    """Demonstrations from a paid API: only with the right key, and an error that quotes a wrong one."""

    def demonstrations(self, count, rng):
        if self.api_key != API_KEY:
            raise RuntimeError(f"the upstream API refused key {self.api_key}")
        return [Demonstration(prompt=f"{self.greeting}\n", turns=(DemonstrationTurn("policy", "hi"),))] * count


class KeyQuotingDemonstrationsEnvironment(KeyedEnvironment):
    def demonstrations(self, count, rng):
        raise RuntimeError(f"the upstream API refused key {self.api_key}")
