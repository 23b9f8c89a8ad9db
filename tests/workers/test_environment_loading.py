"""Entrypoints: Environment subclasses, and plain classes with the same methods, loaded unchanged."""

from __future__ import annotations

import pytest

from environments import Environment, EnvironmentLoadError, load_environment_class
from environments.builtin.calculator import CalculatorEnvironment
from tandem.contracts import EnvironmentSpec
from tests.workers import plain_environments
from tests.workers.test_producer import _publish_policy, _stream_records
from workers.producer import produce


def _spec(entrypoint: str) -> EnvironmentSpec:
    return EnvironmentSpec(name="loading", kind="python", entrypoint=entrypoint)


def test_a_subclass_is_used_as_it_is():
    loaded = load_environment_class(_spec("environments.builtin.calculator:CalculatorEnvironment"))
    assert loaded is CalculatorEnvironment


@pytest.mark.parametrize("class_name", ["TupleCountdown", "MappingEcho"])
def test_a_plain_class_with_the_methods_runs_episodes_unchanged(redis_client, redis_url, run_id, class_name):
    entrypoint = f"tests.workers.plain_environments:{class_name}"
    loaded = load_environment_class(_spec(entrypoint))
    assert issubclass(loaded, Environment) and loaded.__name__ == class_name
    plain_environments.CLOSED.clear()

    _publish_policy(redis_client, run_id, class_name, entrypoint)
    summary = produce(redis_url=redis_url, run_id=run_id, first_group_index=0, num_groups=1)
    records = _stream_records(redis_client, run_id)
    assert (summary.episodes, summary.failed) == (3, 0)
    # The echo ends its episodes; the countdown outlasts max_turns, which cuts it off and says so.
    expected = ("truncated", "reached max_turns=2 before the environment ended the episode") \
        if class_name == "TupleCountdown" else ("ok", "")
    assert all((record.status, record.failure_reason) == expected for record in records), \
        [r.failure_reason for r in records]
    # The countdown pays 0.5 for each of its 2 turns (max_turns); the echo pays 1 at once.
    assert [record.reward for record in records] == [1.0] * 3
    assert [record.num_turns for record in records] == [2 if class_name == "TupleCountdown" else 1] * 3
    assert [class_name] * 3 == plain_environments.CLOSED  # its own close(), sync or async


def test_a_plain_class_answering_something_else_fails_its_episodes_with_the_reason(redis_client, redis_url, run_id):
    _publish_policy(redis_client, run_id, "list-answer", "tests.workers.plain_environments:ListAnswer")
    produce(redis_url=redis_url, run_id=run_id, first_group_index=0, num_groups=1)
    records = _stream_records(redis_client, run_id)
    assert len(records) == 3 and all(r.status == "failed" for r in records)
    assert records[0].failure_reason.startswith("step returned a list, expected StepResult, an (observation,")


@pytest.mark.parametrize(("entrypoint", "message"), [
    ("tests.workers.plain_environments:SynchronousStep", "lacks async step()"),
    ("tests.workers.plain_environments:CLOSED", "is not a class"),
    ("tests.workers.test_environment_loading:_spec", "is not a class"),
    ("tests.workers.plain_environments:Missing", "is not a class"),
])
def test_what_is_not_an_environment_is_refused_with_what_it_lacks(entrypoint, message):
    with pytest.raises(EnvironmentLoadError, match=message):
        load_environment_class(_spec(entrypoint))
