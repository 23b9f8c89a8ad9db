"""Held-out evaluation tasks never appear in training: each environment kind's split, proven disjoint."""

from __future__ import annotations

import asyncio
import random

import pytest

from environments import EVALUATION_SEED_BASE, http_example_server, load_environment_class
from environments.adapters.http import RemoteHTTPEnvironment
from environments.adapters.openenv import OpenEnvEnvironment
from environments.adapters.reasoning_gym import ReasoningGymEnvironment
from environments.builtin.calculator import CalculatorEnvironment
from environments.builtin.guessing_game import GuessingGameEnvironment
from tandem.contracts import EnvironmentSpec
from workers.producer import evaluation_task_seed, group_task_seed


def _tasks(draw, seeds) -> list[str]:
    return [repr(sorted(draw(random.Random(seed)).items())) for seed in seeds]


@pytest.mark.parametrize("environment", [CalculatorEnvironment(), CalculatorEnvironment(min_operand=1, max_operand=9),
                                         GuessingGameEnvironment()], ids=["calculator", "one-digit", "guessing"])
def test_an_environment_with_a_split_of_its_own_never_trains_on_an_evaluation_task(environment):
    training = set(_tasks(environment.sample_task, range(3000)))
    evaluation = set(_tasks(environment.sample_evaluation_task, range(EVALUATION_SEED_BASE, EVALUATION_SEED_BASE + 500)))
    assert training and evaluation
    assert not training & evaluation


@pytest.mark.parametrize("settings", [{}, {"min_operand": 1, "max_operand": 9}])
def test_the_calculators_demonstrations_come_from_the_training_split(settings):
    environment = CalculatorEnvironment(**settings)
    demonstrated = {demonstration.prompt for demonstration in environment.demonstrations(300, random.Random(5))}
    held_out = {asyncio.run(CalculatorEnvironment(**settings).reset(environment.sample_evaluation_task(
        random.Random(seed)))) for seed in range(200)}
    assert demonstrated and held_out and not demonstrated & held_out


def test_a_task_space_too_small_to_split_is_a_clear_error():
    # Two neighbouring numbers on the same side of the split: the other side is empty.
    low = next(n for n in range(1, 1000) if GuessingGameEnvironment.is_held_out({"target": n})
               == GuessingGameEnvironment.is_held_out({"target": n + 1}))
    tiny = GuessingGameEnvironment(low=low, high=low + 1)
    held_out = GuessingGameEnvironment.is_held_out({"target": low})
    draw = tiny.sample_task if held_out else tiny.sample_evaluation_task
    with pytest.raises(ValueError, match="too small to split"):
        draw(random.Random(0))


def test_producers_draw_training_and_evaluation_tasks_from_disjoint_seeds():
    """Environments without a split of their own are split by these seeds."""
    rng = random.Random(0)
    training = {group_task_seed(rng.randrange(2**31), rng.randrange(10**7)) for _ in range(20_000)}
    assert max(training) < EVALUATION_SEED_BASE
    evaluation = {evaluation_task_seed(index) for index in range(20_000)}
    assert min(evaluation) >= EVALUATION_SEED_BASE and len(evaluation) == 20_000
    # The same held-out task in every run, so evaluations of different runs compare.
    assert evaluation_task_seed(17) == evaluation_task_seed(17)


class _DuckTyped:
    """A team's environment that never imported Tandem, with a held-out set of its own."""

    def sample_task(self, rng):
        return {"n": rng.randrange(100)}

    def sample_evaluation_task(self, rng):
        return {"n": 100 + rng.randrange(100)}

    async def reset(self, task):
        return str(task["n"])

    async def step(self, action):
        return ("", 0.0, True, {})


class _DuckTypedWithoutSplit(_DuckTyped):
    sample_evaluation_task = None


def test_a_duck_typed_environments_own_split_is_used_and_the_seeded_default_otherwise(monkeypatch):
    monkeypatch.setenv("TANDEM_ENVIRONMENT_MODULES", "tests.environments")
    for name, expected in (("_DuckTyped", {"n": 100 + random.Random(3).randrange(100)}),
                           ("_DuckTypedWithoutSplit", {"n": random.Random(3).randrange(100)})):
        cls = load_environment_class(EnvironmentSpec(
            name="duck", kind="python", entrypoint=f"tests.environments.test_evaluation_split:{name}"))
        assert cls().sample_evaluation_task(random.Random(3)) == expected


def test_seeded_adapters_draw_each_split_from_its_own_seed_range():
    openenv = OpenEnvEnvironment.__new__(OpenEnvEnvironment)  # sampling needs no server
    http = RemoteHTTPEnvironment.__new__(RemoteHTTPEnvironment)
    for seed in range(2000):
        assert openenv.sample_task(random.Random(seed))["seed"] < EVALUATION_SEED_BASE
        assert openenv.sample_evaluation_task(random.Random(seed))["seed"] >= EVALUATION_SEED_BASE
        assert http.sample_task(random.Random(seed))["remote_seed"] < EVALUATION_SEED_BASE
        assert http.sample_evaluation_task(random.Random(seed)) == {
            "remote_seed": http.sample_evaluation_task(random.Random(seed))["remote_seed"], "split": "evaluation"}
        assert http.sample_evaluation_task(random.Random(seed))["remote_seed"] >= EVALUATION_SEED_BASE


def test_an_http_server_with_a_held_out_set_serves_it_for_evaluation_tasks():
    async def prompts(url: str, draw, seeds) -> set[str]:
        environment = RemoteHTTPEnvironment(url=url)
        seen = set()
        for seed in seeds:
            seen.add(await environment.reset(draw(environment, random.Random(seed))))
            await environment.close()
        return seen

    with http_example_server.running() as url:
        training = asyncio.run(prompts(url, RemoteHTTPEnvironment.sample_task, range(60)))
        evaluation = asyncio.run(prompts(url, RemoteHTTPEnvironment.sample_evaluation_task, range(60)))
    assert all(CalculatorEnvironment.is_held_out({"expression": prompt.split("=")[0]}) for prompt in evaluation)
    assert not any(CalculatorEnvironment.is_held_out({"expression": prompt.split("=")[0]}) for prompt in training)


def test_reasoning_gym_evaluates_on_entries_generated_from_another_of_its_seeds():
    environment = ReasoningGymEnvironment(dataset="leg_counting", size=50, seed=1)

    def questions(draw) -> set[str]:
        seen = set()
        for seed in range(50):
            task = draw(random.Random(seed))
            asyncio.run(environment.reset(task))
            seen.add(environment._entry["question"])
        return seen

    training, evaluation = questions(environment.sample_task), questions(environment.sample_evaluation_task)
    assert training and evaluation and training != evaluation
    assert all(task["split"] == "evaluation"
               for task in (environment.sample_evaluation_task(random.Random(seed)) for seed in range(5)))
