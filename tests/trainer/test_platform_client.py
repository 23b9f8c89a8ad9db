"""The trainer's platform client reads the platform's answers by their codes and typed replies."""

import json

import httpx
import pytest

import trainer.main as trainer_main
from tandem.contracts import RunStatus, TrainerConflictCode, TrainerHeartbeat
from trainer.platform_client import PlatformClient, RunTakenOverError, UnusableClaimError


def _client_answering(status_code: int, body: dict) -> PlatformClient:
    client = PlatformClient("http://platform.test", "token", retries=0)
    client._http = httpx.Client(base_url="http://platform.test",
                                transport=httpx.MockTransport(lambda request: httpx.Response(status_code,
                                                                                             json=body)))
    return client


def _conflict(code: str, message: str) -> dict:
    return {"error": {"code": code, "message": message, "fields": {}}}


def test_a_heartbeat_returns_the_run_status_of_the_reply():
    client = _client_answering(200, {"schema_version": 1, "status": "paused"})

    assert client.heartbeat(7, TrainerHeartbeat(worker="w:1")) == RunStatus.PAUSED


def test_a_reply_of_an_older_platform_without_schema_version_still_reads():
    client = _client_answering(200, {"status": "running"})

    assert client.heartbeat(7, TrainerHeartbeat(worker="w:1")) == RunStatus.RUNNING


def test_the_code_of_a_run_held_by_another_trainer_stops_this_one_with_the_platforms_message():
    message = "Run 7 is held by trainer b:2, not w:1."
    client = _client_answering(409, _conflict(TrainerConflictCode.RUN_HELD_BY_ANOTHER_TRAINER, message))

    with pytest.raises(RunTakenOverError, match="held by trainer b:2"):
        client.heartbeat(7, TrainerHeartbeat(worker="w:1"))


def test_another_conflict_is_not_taken_for_a_takeover_whatever_its_message_says():
    client = _client_answering(409, _conflict(TrainerConflictCode.RUN_NOT_CLAIMED, "held by trainer (sic)"))

    with pytest.raises(httpx.HTTPStatusError):
        client.heartbeat(7, TrainerHeartbeat(worker="w:1"))


def _claim_of(config: dict) -> dict:
    return {"run": {"id": 9, "name": "stored-before-a-rule", "config": config, "attempts": 1,
                    "environment": {"name": "calculator", "kind": "python",
                                    "entrypoint": "environments.builtin.calculator:CalculatorEnvironment"}}}


def test_a_claimed_run_whose_stored_config_is_invalid_is_refused_naming_the_run_and_the_field():
    client = _client_answering(200, _claim_of({"rl_steps": -1}))

    with pytest.raises(UnusableClaimError, match="rl_steps") as refused:
        client.claim("w:1")
    assert refused.value.run_id == 9


def test_the_trainer_fails_an_unusable_run_with_its_reason_and_stays_up(monkeypatch, tmp_path, redis_url):
    """Before, a claim that did not validate escaped the loop and ended the trainer process."""
    answers = iter([httpx.Response(200, json=_claim_of({"rl_steps": -1}))])
    heartbeats: list[dict] = []

    def platform(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/heartbeat/"):
            heartbeats.append(json.loads(request.content))
            return httpx.Response(200, json={"schema_version": 1, "status": "failed"})
        return next(answers, httpx.Response(204))

    def client_of_this_platform(url, token):
        client = PlatformClient(url, token, retries=0)
        client._http = httpx.Client(base_url=url, transport=httpx.MockTransport(platform))
        return client

    monkeypatch.setattr(trainer_main, "PlatformClient", client_of_this_platform)
    runs = trainer_main.serve(platform_url="http://platform.test", token="t", redis_url=redis_url,
                              checkpoint_root=tmp_path, poll_s=0.01, max_runs=1)

    assert runs == 1
    assert [(beat["status"], "rl_steps" in beat["message"]) for beat in heartbeats] == [("failed", True)]
