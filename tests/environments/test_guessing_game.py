"""The guessing game: hints, discounted rewards, and demonstrations that replay to a win."""

from __future__ import annotations

import asyncio
import random

import pytest

from environments.builtin.guessing_game import GuessingGameEnvironment


def _play(environment, target, guesses):
    async def play():
        await environment.reset({"target": target})
        return [await environment.step(guess) for guess in guesses]
    return asyncio.run(play())


def test_hints_point_towards_the_target_until_it_is_found():
    results = _play(GuessingGameEnvironment(), 37, ["A:50", "A:25", "A:37"])
    assert [r.observation for r in results] == ["lower\n", "higher\n", ""]
    assert [r.done for r in results] == [False, False, True]
    assert results[-1].reward == pytest.approx(0.9**2) and results[-1].info == {"outcome": "found", "guesses": 3}


def test_a_first_guess_that_is_right_pays_one():
    assert _play(GuessingGameEnvironment(), 50, ["A:50"])[0].reward == 1.0


def test_running_out_of_guesses_pays_nothing():
    results = _play(GuessingGameEnvironment(max_guesses=2), 37, ["A:1", "A:2"])
    assert results[-1].done and results[-1].reward == 0.0 and results[-1].info["outcome"] == "out of guesses"


def test_a_malformed_guess_ends_the_episode_without_reward():
    result = _play(GuessingGameEnvironment(), 37, ["fifty"])[0]
    assert result.done and result.reward == 0.0 and result.info["outcome"] == "malformed guess"


def test_with_retry_malformed_a_malformed_guess_costs_a_guess_and_says_the_format():
    results = _play(GuessingGameEnvironment(max_guesses=3, retry_malformed=True), 37, ["fifty", "A:37"])
    assert [r.observation for r in results] == ["answer as A:<number>\n", ""]
    assert results[0].info == {"outcome": "malformed guess", "guesses": 1} and not results[0].done
    assert results[1].done and results[1].reward == pytest.approx(0.9)

    out_of_guesses = _play(GuessingGameEnvironment(max_guesses=2, retry_malformed=True), 37, ["?", "??"])
    assert [r.done for r in out_of_guesses] == [False, True] and out_of_guesses[-1].reward == 0.0


def test_tasks_stay_in_range_and_follow_the_seed():
    environment = GuessingGameEnvironment(low=5, high=9)
    targets = [environment.sample_task(random.Random(seed))["target"] for seed in range(50)]
    assert set(targets) <= set(range(5, 10)) and len(set(targets)) > 1
    assert environment.sample_task(random.Random(3)) == environment.sample_task(random.Random(3))


def test_demonstrations_replay_against_the_environment_and_mostly_bisect():
    environment = GuessingGameEnvironment(low=1, high=100, max_guesses=10, binary_search_fraction=0.5)
    demos = environment.demonstrations(40, random.Random(0))
    lengths = []
    for demo in demos:
        policy_turns = [t.text for t in demo.turns if t.role == "policy"]
        hints = [t.text for t in demo.turns if t.role == "environment"]
        first = int(policy_turns[0].removeprefix("A:"))
        # Recover the target from the demo by replaying its own hints on every candidate.
        candidates = [
            target for target in range(1, 101)
            if [r.observation for r in _play(GuessingGameEnvironment(), target, policy_turns)][:-1] == hints
        ]
        assert candidates, demo
        lengths.append(len(policy_turns))
        assert 1 <= first <= 100
    bisecting = [d for d in demos if int(d.turns[0].text.removeprefix("A:")) == 50]
    assert bisecting and all(len([t for t in d.turns if t.role == "policy"]) <= 7 for d in bisecting)
    assert max(lengths) > 7 or len(bisecting) < len(demos)  # some demonstrations are imperfect


def test_settings_are_validated():
    with pytest.raises(ValueError):
        GuessingGameEnvironment(low=5, high=5)
