"""The demonstrations producer against a real Redis: what it answers the trainer's requests with."""

from __future__ import annotations

import random

import pytest
from cryptography.fernet import Fernet

from environments import demonstration_messages
from environments.builtin.calculator import CalculatorEnvironment
from tandem.configs.run import RunConfig
from tandem.contracts import (
    DemonstrationBatch,
    EnvironmentSecrets,
    EnvironmentSpec,
    RunSpec,
    demonstration_stream,
    producer_fault_key,
    run_environment_secrets_key,
    run_spec_key,
    run_stop_key,
)
from tandem.runtime.secrets_at_rest import SECRETS_KEY_ENV, SecretsCipher, environment_secrets_seal
from tests.conftest import UNTRUSTED_MODULE
from tests.workers.secret_environments import API_KEY
from workers.demonstrations import produce_demonstrations

CALCULATOR = "environments.builtin.calculator:CalculatorEnvironment"


@pytest.fixture
def run_with_environment(redis_client, run_id):
    """Writes the spec of run ``run_id`` with the environment of ``entrypoint``, as a trainer does."""
    def write(entrypoint: str, **settings) -> RunSpec:
        spec = RunSpec(run_id=run_id, config=RunConfig(),
                       environment=EnvironmentSpec(name="demo-env", kind="python", entrypoint=entrypoint,
                                                   settings=settings))
        redis_client.set(run_spec_key(run_id), spec.model_dump_json())
        return spec

    yield write
    redis_client.delete(run_spec_key(run_id), run_stop_key(run_id), demonstration_stream(run_id),
                        run_environment_secrets_key(run_id))


def _ask(redis_url, run_id, *, step=3, count=4, seed=1234, tool_call_format="qwen"):
    return produce_demonstrations(redis_url=redis_url, run_id=run_id, step=step, count=count, seed=seed,
                                  tool_call_format=tool_call_format, request_id=f"request-{step}")


def _answers(redis_client, run_id) -> list[DemonstrationBatch]:
    return [DemonstrationBatch.from_stream_fields(fields)
            for _, fields in redis_client.xrange(demonstration_stream(run_id))]


def test_a_producer_answers_with_the_environments_demonstrations_in_the_runs_tool_call_format(
    redis_url, redis_client, run_id, run_with_environment
):
    run_with_environment(CALCULATOR, tool_use_fraction=1.0)

    _ask(redis_url, run_id, step=3, count=4, seed=1234, tool_call_format="qwen")

    [batch] = _answers(redis_client, run_id)
    assert (batch.run_id, batch.step, batch.request_id, batch.error) == (run_id, 3, "request-3", "")
    environment = CalculatorEnvironment(tool_use_fraction=1.0)
    expected = [demonstration_messages(demo, environment.tools, "qwen")
                for demo in environment.demonstrations(4, random.Random(1234))]
    assert [[message.model_dump(exclude_defaults=True) | (
        {"tool_calls": [call.model_dump(include={"name", "arguments"}) for call in message.tool_calls]}
        if message.tool_calls else {})
        for message in demonstration] for demonstration in batch.messages] == expected
    assert any(message.tool_calls for demonstration in batch.messages for message in demonstration)
    assert "<tool_call>" in batch.messages[0][1].content  # the call as the run's model writes it


def test_an_environment_outside_the_allow_list_is_answered_with_an_error_and_never_imported(
    import_marker, redis_url, redis_client, run_id, run_with_environment
):
    run_with_environment(f"{UNTRUSTED_MODULE}:UntrustedEnvironment")

    _ask(redis_url, run_id)

    [batch] = _answers(redis_client, run_id)
    assert batch.messages == []
    assert "cannot be loaded" in batch.error and "TANDEM_ENVIRONMENT_MODULES" in batch.error


def test_demonstrations_that_raise_are_answered_with_their_reason(
    redis_url, redis_client, run_id, run_with_environment
):
    run_with_environment("tests.workers.demonstration_environments:RaisingDemonstrationsEnvironment")

    _ask(redis_url, run_id)

    [batch] = _answers(redis_client, run_id)
    assert batch.messages == []
    assert batch.error == ("environment demo-env: demonstrations() raised RuntimeError: "
                           "the demonstrator is broken")


def test_an_environment_without_demonstrations_is_answered_with_none_and_no_error(
    redis_url, redis_client, run_id, run_with_environment
):
    run_with_environment("tests.workers.demonstration_environments:NoDemonstrationsEnvironment")

    _ask(redis_url, run_id)

    [batch] = _answers(redis_client, run_id)
    assert (batch.messages, batch.error) == ([], "")


def test_a_run_that_ended_gets_no_answer(redis_url, redis_client, run_id, run_with_environment):
    run_with_environment(CALCULATOR)
    redis_client.set(run_stop_key(run_id), "1")

    assert _ask(redis_url, run_id) is None
    assert _answers(redis_client, run_id) == []


KEYED_VERSION_ID = 9_000_002


def _keyed_run(redis_client, run_id, environment_class: str) -> None:
    """A run of a version with secret settings, as a claim leaves it: the spec names them, the platform wrote them."""
    environment = EnvironmentSpec(name="keyed", version=1, version_id=KEYED_VERSION_ID, kind="python",
                                  entrypoint=f"tests.workers.demonstration_environments:{environment_class}",
                                  settings={"greeting": "hi"}, secret_setting_names=("api_key",))
    redis_client.set(run_spec_key(run_id),
                     RunSpec(run_id=run_id, config=RunConfig(), environment=environment).model_dump_json())
    redis_client.set(run_environment_secrets_key(run_id), environment_secrets_seal(EnvironmentSecrets(
        version_id=KEYED_VERSION_ID, settings={"api_key": API_KEY}), SecretsCipher.from_environment()))


def test_demonstrations_are_made_with_the_environments_secret_settings(
    redis_url, redis_client, run_id, run_with_environment
):
    _keyed_run(redis_client, run_id, "KeyedDemonstrationsEnvironment")

    _ask(redis_url, run_id, count=2)

    [batch] = _answers(redis_client, run_id)
    assert batch.error == "" and len(batch.messages) == 2


def test_a_worker_whose_key_is_not_the_platforms_answers_why_instead_of_retrying(
    redis_url, redis_client, run_id, run_with_environment, monkeypatch
):
    _keyed_run(redis_client, run_id, "KeyedDemonstrationsEnvironment")
    monkeypatch.setenv(SECRETS_KEY_ENV, Fernet.generate_key().decode())

    try:
        _ask(redis_url, run_id, count=2)
    finally:
        redis_client.delete(producer_fault_key(run_id))

    [batch] = _answers(redis_client, run_id)
    assert "cannot decrypt the secret settings of keyed@1" in batch.error and not batch.messages


def test_a_demonstrations_error_never_quotes_a_secret_setting(redis_url, redis_client, run_id, run_with_environment):
    _keyed_run(redis_client, run_id, "KeyQuotingDemonstrationsEnvironment")

    _ask(redis_url, run_id)

    [batch] = _answers(redis_client, run_id)
    assert API_KEY not in batch.error
    assert batch.error.endswith("the upstream API refused key [secret api_key]")
