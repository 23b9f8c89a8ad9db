"""Issue 15, finding 10: producers and probes build an environment with its secret settings, and
nothing they send back (a probe's checks, an episode's failure reason) quotes a value.

Real Redis and a real JAX sampler, as in test_producer.py; the platform's side (the claim writes
the key, the trainer's claim holds only the names) is tests/platform/test_security_secret_settings.py.
The Redis values are Fernet tokens (issue 28, finding 18; tests/platform/test_security_secrets_at_rest.py):
workers decrypt them with TANDEM_SECRETS_KEY, which the test settings set for the whole suite.
"""

from __future__ import annotations

import pytest
from cryptography.fernet import Fernet
from flax import nnx

from policy.model import Transformer, TransformerConfig, split_model
from policy.tokenizer import VOCAB_SIZE
from policy.weights import RedisWeightPublisher
from tandem.configs.rollout import RolloutConfig, SamplingConfig
from tandem.configs.run import ModelConfig, RunConfig
from tandem.contracts import (
    EnvironmentSecrets,
    EnvironmentSpec,
    ProbeRequest,
    ProbeTimeouts,
    ProducerFault,
    RunSpec,
    TrajectoryRecord,
    probe_environment_secrets_key,
    probe_request_key,
    producer_fault_key,
    run_environment_secrets_key,
    run_spec_key,
    trajectory_stream,
)
from tandem.runtime.secrets_at_rest import SECRETS_KEY_ENV, SecretsCipher, environment_secrets_seal
from tests.workers.secret_environments import API_KEY, SERVICE_ACCOUNT_KEY, SERVICE_ACCOUNT_KEY_BODY
from workers.probe import probe_by_id
from workers.producer import RunNotReadyError, SecretSettingsUndecryptableError, produce

CONFIG = RunConfig(
    model=ModelConfig(d_model=32, num_layers=1, num_heads=2, mlp_dim=64, max_seq_len=128),
    rollout=RolloutConfig(group_size=2, max_turns=1, environment_timeout_s=2.0),
    sampling=SamplingConfig(max_new_tokens=4),
)
VERSION_ID = 9_000_001


def _keyed_spec(environment_class: str) -> EnvironmentSpec:
    return EnvironmentSpec(name="keyed", version=1, version_id=VERSION_ID, kind="python",
                           entrypoint=f"tests.workers.secret_environments:{environment_class}",
                           settings={"greeting": "hi"}, secret_setting_names=("api_key",))


def _publish_run(redis_client, run_id: int, environment: EnvironmentSpec, *, secrets: bool = True,
                 api_key: str = API_KEY) -> None:
    """What a claim leaves in Redis: the trainer's spec and weights, the platform's secrets key."""
    model = Transformer(TransformerConfig.from_model_config(CONFIG.model, VOCAB_SIZE), rngs=nnx.Rngs(0))
    RedisWeightPublisher(redis_client).publish(run_id=run_id, version=1, params=split_model(model)[1])
    redis_client.set(run_spec_key(run_id),
                     RunSpec(run_id=run_id, config=CONFIG, environment=environment).model_dump_json())
    if secrets:
        record = EnvironmentSecrets(version_id=VERSION_ID, settings={"api_key": api_key})
        redis_client.set(run_environment_secrets_key(run_id), _sealed(record))


def _sealed(record: EnvironmentSecrets) -> str:
    """As the platform writes it: a Fernet token under the suite's TANDEM_SECRETS_KEY."""
    return environment_secrets_seal(record, SecretsCipher.from_environment())


def _records(redis_client, run_id: int) -> list[TrajectoryRecord]:
    return [TrajectoryRecord.from_stream_fields(fields) for _, fields in redis_client.xrange(trajectory_stream(run_id))]


@pytest.fixture
def secrets_key_cleanup(redis_client, run_id):
    yield
    redis_client.delete(run_environment_secrets_key(run_id), producer_fault_key(run_id))


def test_secret_settings_reach_the_producer_environment(redis_client, redis_url, run_id, secrets_key_cleanup):
    _publish_run(redis_client, run_id, _keyed_spec("KeyedEnvironment"))

    summary = produce(redis_url=redis_url, run_id=run_id, first_group_index=0, num_groups=1)

    records = _records(redis_client, run_id)
    assert (summary.episodes, summary.failed) == (2, 0)
    # KeyedEnvironment cannot be built without api_key, and rewards 1 only with the right one.
    assert [record.reward for record in records] == [1.0, 1.0]


def test_an_episode_failure_reason_never_quotes_a_secret_setting(redis_client, redis_url, run_id,
                                                                 secrets_key_cleanup):
    _publish_run(redis_client, run_id, _keyed_spec("KeyQuotingEnvironment"))

    produce(redis_url=redis_url, run_id=run_id, first_group_index=0, num_groups=1)

    reasons = {record.failure_reason for record in _records(redis_client, run_id)}
    assert reasons == {"step raised RuntimeError: the upstream API refused key [secret api_key]"}
    assert all(API_KEY.encode() not in value for _, fields in redis_client.xrange(trajectory_stream(run_id))
               for value in fields.values())


def test_an_episode_failure_reason_never_echoes_a_json_key_in_any_escaping(redis_client, redis_url, run_id,
                                                                         secrets_key_cleanup):
    # Issue 28, finding 10: before, only the raw value was replaced, and repr() or json.dumps() of a
    # key with quotes, backslashes or newlines (a JSON service-account key) went through whole.
    _publish_run(redis_client, run_id, _keyed_spec("KeyEchoingEnvironment"), api_key=SERVICE_ACCOUNT_KEY)

    produce(redis_url=redis_url, run_id=run_id, first_group_index=0, num_groups=1)

    [reason] = {record.failure_reason for record in _records(redis_client, run_id)}
    stored = [value for _, fields in redis_client.xrange(trajectory_stream(run_id)) for value in fields.values()]
    assert not any(SERVICE_ACCOUNT_KEY_BODY.encode() in value for value in stored), reason
    assert reason.count("[secret api_key]") == 3, reason


def test_a_producer_whose_key_is_not_the_platforms_fails_the_run_saying_why(redis_client, redis_url, run_id,
                                                                          secrets_key_cleanup, monkeypatch):
    _publish_run(redis_client, run_id, _keyed_spec("KeyedEnvironment"))
    monkeypatch.setenv(SECRETS_KEY_ENV, Fernet.generate_key().decode())

    with pytest.raises(SecretSettingsUndecryptableError, match="cannot decrypt the secret settings of keyed@1"):
        produce(redis_url=redis_url, run_id=run_id, first_group_index=0, num_groups=1)

    # Not retried (it is no RunNotReadyError): the trainer fails the run with this reason.
    fault = ProducerFault.model_validate_json(redis_client.get(producer_fault_key(run_id)))
    assert fault.kind == "secrets_undecryptable"
    assert "none of the 1 key(s) in TANDEM_SECRETS_KEY decrypts" in fault.reason
    assert _records(redis_client, run_id) == []


def test_a_producer_without_a_key_fails_the_run_naming_the_variable(redis_client, redis_url, run_id,
                                                                    secrets_key_cleanup, monkeypatch):
    _publish_run(redis_client, run_id, _keyed_spec("KeyedEnvironment"))
    monkeypatch.delenv(SECRETS_KEY_ENV)
    monkeypatch.delenv("TANDEM_SECRETS_KEY_FILE", raising=False)

    with pytest.raises(SecretSettingsUndecryptableError):
        produce(redis_url=redis_url, run_id=run_id, first_group_index=0, num_groups=1)

    fault = ProducerFault.model_validate_json(redis_client.get(producer_fault_key(run_id)))
    assert "TANDEM_SECRETS_KEY is not set in this process's environment" in fault.reason


def test_a_producer_waits_for_secret_settings_that_are_not_in_redis(redis_client, redis_url, run_id):
    _publish_run(redis_client, run_id, _keyed_spec("KeyedEnvironment"), secrets=False)

    with pytest.raises(RunNotReadyError, match="secret settings of keyed@1 \\(api_key\\) are not in Redis"):
        produce(redis_url=redis_url, run_id=run_id, first_group_index=0, num_groups=1)

    assert _records(redis_client, run_id) == []


def _probe_from_redis(redis_client, redis_url, environment: EnvironmentSpec, probe_id: int, *,
                      secret_settings: dict[str, str] | None = None):
    """Probe as a probe task does: the platform's request and secrets read from Redis by the probe's id."""
    timeouts = ProbeTimeouts(url=5, load=10, reset=2, tools=2, step=2, close=2)
    request = ProbeRequest(probe_id=probe_id, purpose="registration", environment=environment, timeouts=timeouts)
    redis_client.set(probe_request_key(probe_id), request.model_dump_json())
    if secret_settings is not None:
        secrets = EnvironmentSecrets(version_id=VERSION_ID, settings=secret_settings)
        redis_client.set(probe_environment_secrets_key(probe_id), _sealed(secrets))
    try:
        return probe_by_id(redis_url=redis_url, probe_id=probe_id)
    finally:
        redis_client.delete(probe_request_key(probe_id), probe_environment_secrets_key(probe_id))


def test_secret_settings_reach_the_probed_environment(redis_client, redis_url, run_id):
    report = _probe_from_redis(redis_client, redis_url, _keyed_spec("KeyedEnvironment"), run_id,
                               secret_settings={"api_key": API_KEY})

    assert report.passed, report.checks
    assert next(check for check in report.checks if check.name == "step").message == "reward 1, done True"


def test_a_probe_whose_secret_settings_are_gone_fails_saying_so(redis_client, redis_url, run_id):
    report = _probe_from_redis(redis_client, redis_url, _keyed_spec("KeyedEnvironment"), run_id)

    [check] = report.checks
    assert check.name == "request" and check.status == "failed"
    assert check.message.startswith("the secret settings (api_key) are not in Redis")


def test_a_probe_report_never_quotes_a_secret_setting(redis_client, redis_url, run_id):
    report = _probe_from_redis(redis_client, redis_url, _keyed_spec("KeyQuotingEnvironment"), run_id,
                               secret_settings={"api_key": API_KEY})

    step = next(check for check in report.checks if check.name == "step")
    assert step.status == "failed"
    assert step.message == "RuntimeError: the upstream API refused key [secret api_key]"
    assert API_KEY not in report.model_dump_json()


def test_a_probe_report_never_echoes_a_json_key_in_any_escaping(redis_client, redis_url, run_id):
    report = _probe_from_redis(redis_client, redis_url, _keyed_spec("KeyEchoingEnvironment"), run_id,
                               secret_settings={"api_key": SERVICE_ACCOUNT_KEY})

    step = next(check for check in report.checks if check.name == "step")
    assert step.status == "failed"
    assert SERVICE_ACCOUNT_KEY_BODY not in report.model_dump_json(), step.message
    assert step.message.count("[secret api_key]") == 3, step.message


def test_a_probe_whose_worker_has_the_wrong_key_fails_saying_so(redis_client, redis_url, run_id, monkeypatch):
    sealed_by_platform = _sealed(EnvironmentSecrets(version_id=VERSION_ID, settings={"api_key": API_KEY}))
    monkeypatch.setenv(SECRETS_KEY_ENV, Fernet.generate_key().decode())
    timeouts = ProbeTimeouts(url=5, load=10, reset=2, tools=2, step=2, close=2)
    request = ProbeRequest(probe_id=run_id, purpose="registration", environment=_keyed_spec("KeyedEnvironment"),
                           timeouts=timeouts)
    redis_client.set(probe_request_key(run_id), request.model_dump_json())
    redis_client.set(probe_environment_secrets_key(run_id), sealed_by_platform)
    try:
        report = probe_by_id(redis_url=redis_url, probe_id=run_id)
    finally:
        redis_client.delete(probe_request_key(run_id), probe_environment_secrets_key(run_id))

    [check] = report.checks
    assert check.name == "request" and check.status == "failed"
    assert check.message.startswith("this worker cannot decrypt the secret settings: none of the 1 key(s)")
