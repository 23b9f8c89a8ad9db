"""Circuit breakers: repeated environment faults stop dispatch for a cool-down, then a probe decides."""

from __future__ import annotations

import asyncio

import pytest

from environments.builtin.calculator import CalculatorEnvironment
from workers.agent import EpisodeLimits, run_episode
from workers.circuit_breaker import CircuitBreakers, breakers_from_environ, circuit_breaker_states

LIMITS = EpisodeLimits(max_turns=2, max_seq_len=128, max_new_tokens=8, environment_timeout_s=0.5)


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class NoGenerationPolicy:
    """Stands in for the sampler in episodes that end before generating."""

    def end_session(self, session_id):
        pass

    async def generate(self, token_ids, *, session_id):
        raise AssertionError("these episodes never reach the policy")


class BrokenResetEnvironment(CalculatorEnvironment):
    resets = 0

    async def reset(self, task):
        type(self).resets += 1
        raise ConnectionError("environment server unreachable")


def _episode(environment, breakers, name="broken"):
    return asyncio.run(run_episode(
        run_id=1, group_id="1-0", group_size=1, environment_name=name, environment=environment,
        task={"expression": "1+1"}, policy=NoGenerationPolicy(), limits=LIMITS, circuit_breakers=breakers,
    ))


def test_the_breaker_opens_after_consecutive_failures_and_fails_new_episodes_fast():
    clock = FakeClock()
    breakers = CircuitBreakers(failure_threshold=3, cooldown_s=60, clock=clock)
    BrokenResetEnvironment.resets = 0
    reasons = [_episode(BrokenResetEnvironment(), breakers).failure_reason for _ in range(5)]
    assert reasons[:3] == ["reset raised ConnectionError: environment server unreachable"] * 3
    assert all(r.startswith("circuit open: 3 consecutive failed episodes of 'broken'") for r in reasons[3:])
    assert BrokenResetEnvironment.resets == 3  # open: the environment is not called at all
    assert breakers.states() == {"broken": {
        "state": "open", "consecutive_failures": 3, "opened_at": 1000.0,
        "last_failure_reason": "reset raised ConnectionError: environment server unreachable",
    }}


def test_after_the_cooldown_one_probe_closes_the_breaker_on_success():
    clock = FakeClock()
    breakers = CircuitBreakers(failure_threshold=1, cooldown_s=60, clock=clock)
    assert _episode(BrokenResetEnvironment(), breakers).status == "failed"
    clock.now += 61
    assert breakers.states()["broken"]["state"] == "half_open"
    assert breakers.admit("broken") is None  # the probe
    assert breakers.admit("broken").startswith("circuit open:")  # others wait for its verdict
    breakers.record_success("broken")
    assert breakers.states()["broken"] == {"state": "closed", "consecutive_failures": 0, "opened_at": None,
                                           "last_failure_reason": ""}


def test_a_failed_probe_reopens_the_breaker_for_another_cooldown():
    clock = FakeClock()
    breakers = CircuitBreakers(failure_threshold=2, cooldown_s=60, clock=clock)
    for _ in range(2):
        _episode(BrokenResetEnvironment(), breakers)
    clock.now += 61
    assert _episode(BrokenResetEnvironment(), breakers).failure_reason.startswith("reset raised")
    state = breakers.states()["broken"]
    assert state["state"] == "open" and state["opened_at"] == clock.now


def test_a_success_resets_the_count_of_consecutive_failures():
    breakers = CircuitBreakers(failure_threshold=2, cooldown_s=60, clock=FakeClock())
    breakers.record_failure("env", "boom")
    breakers.record_success("env")
    breakers.record_failure("env", "boom")
    assert breakers.admit("env") is None and breakers.states()["env"]["consecutive_failures"] == 1


def test_generation_failures_do_not_count_against_the_environment():
    class FailingPolicy(NoGenerationPolicy):
        async def generate(self, token_ids, *, session_id):
            raise RuntimeError("sampler out of memory")

    breakers = CircuitBreakers(failure_threshold=1, cooldown_s=60, clock=FakeClock())
    record = asyncio.run(run_episode(
        run_id=1, group_id="1-0", group_size=1, environment_name="calculator",
        environment=CalculatorEnvironment(), task={"expression": "1+1"}, policy=FailingPolicy(),
        limits=LIMITS, circuit_breakers=breakers,
    ))
    assert record.failure_reason == "generation failed: RuntimeError: sampler out of memory"
    assert breakers.admit("calculator") is None


def test_breakers_are_kept_per_environment():
    breakers = CircuitBreakers(failure_threshold=1, cooldown_s=60, clock=FakeClock())
    breakers.record_failure("a", "boom")
    assert breakers.admit("a").startswith("circuit open:") and breakers.admit("b") is None


def test_the_process_breakers_state_is_reportable():
    assert isinstance(circuit_breaker_states(), dict)


def test_an_environment_is_closed_after_its_episode():
    closed = []

    class ClosingEnvironment(BrokenResetEnvironment):
        async def close(self):
            closed.append(True)

    _episode(ClosingEnvironment(), CircuitBreakers())
    assert closed == [True]


@pytest.mark.parametrize(("threshold", "cooldown"), [(0, 1), (1, -1)])
def test_breaker_settings_are_validated(threshold, cooldown):
    with pytest.raises(ValueError):
        CircuitBreakers(failure_threshold=threshold, cooldown_s=cooldown)


def test_breaker_settings_come_from_the_worker_environment():
    breakers = breakers_from_environ({"TANDEM_CIRCUIT_FAILURE_THRESHOLD": "2", "TANDEM_CIRCUIT_COOLDOWN_S": "5"})
    assert (breakers.failure_threshold, breakers.cooldown_s) == (2, 5.0)
    assert breakers_from_environ({}).failure_threshold == 5
