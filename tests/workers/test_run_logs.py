"""A producer task's records belong to its run, with its environment's secret settings redacted."""

from __future__ import annotations

import logging

import pytest

from tandem.contracts import EvaluationRequest, RunLogRecord, run_log_stream
from tandem.runtime.run_logs import RunLogShipper, run_log_scope
from workers.run_logs import redact_run_logs_with, task_run_id
from workers.secret_settings import SecretSettings
from workers.tasks import (
    make_demonstrations,
    probe_environment,
    produce_evaluation_episodes,
    produce_rollouts,
)

NEVER = 3600.0


@pytest.fixture
def test_logger():
    log = logging.getLogger("tests.workers.run_logs.subject")
    log.setLevel(logging.DEBUG)
    log.propagate = False
    yield log
    log.handlers.clear()


def test_each_task_of_a_run_names_its_run_however_its_arguments_were_sent():
    request = EvaluationRequest.model_validate({
        "run_id": 12, "evaluation": 0, "policy_version": 3, "first_task": 0, "tasks": 4,
        "samples_per_task": 1, "temperature": 0.0,
    }).model_dump_json()

    assert task_run_id(produce_rollouts, (7, 0, 2), {}) == 7
    assert task_run_id(produce_rollouts, (), {"run_id": 8, "first_group_index": 0, "num_groups": 2}) == 8
    assert task_run_id(make_demonstrations, (9, 0, 4, 1, "qwen", "request-1"), {}) == 9
    assert task_run_id(produce_evaluation_episodes, (request,), {}) == 12
    assert task_run_id(probe_environment, (5,), {}) is None  # a probe works for no run
    assert task_run_id(produce_rollouts, ("not", "enough"), {}) is None


def test_a_scope_with_secrets_redacts_its_records_message_and_traceback(
        redis_client, run_id, test_logger):
    shipper = RunLogShipper(redis_client=redis_client, role="rollout_worker", flush_interval_s=NEVER)
    test_logger.addHandler(shipper)
    secrets = SecretSettings({"api_key": "sk-live-0123456789"})

    with run_log_scope(run_id):
        redact_run_logs_with(secrets)
        try:
            raise PermissionError("invalid API key sk-live-0123456789")
        except PermissionError:
            test_logger.exception("environment refused key sk-live-0123456789")
    shipper.close()

    entries = redis_client.xrange(run_log_stream(run_id))
    redis_client.delete(run_log_stream(run_id))
    (record,) = [RunLogRecord.from_stream_fields(fields) for _, fields in entries]
    assert record.message == "environment refused key [secret api_key]"
    assert "sk-live" not in record.traceback
    assert record.traceback.endswith("PermissionError: invalid API key [secret api_key]")
