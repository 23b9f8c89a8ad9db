"""The trainer's platform client reads the platform's answers by their codes and typed replies."""

import httpx
import pytest

from tandem.contracts import RunStatus, TrainerConflictCode, TrainerHeartbeat
from trainer.platform_client import PlatformClient, RunTakenOverError


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
