"""The trainer's platform client reads the platform's answers by their codes and typed replies."""

import json

import httpx
import pytest

import trainer.main as trainer_main
from tandem.contracts import (
    TRAINER_HEADER,
    EpisodeSpan,
    RunStatus,
    StageSpan,
    StepTimeline,
    TrainerConflictCode,
    TrainerHeartbeat,
    TrainerStepEvent,
)
from trainer.platform_client import (
    MAX_TELEMETRY_POST_BYTES,
    PlatformClient,
    RunTakenOverError,
    UnusableClaimError,
    telemetry_posts,
)


def _client_answering(status_code: int, body: dict) -> PlatformClient:
    client = PlatformClient("http://platform.test", "token", trainer_name="w:1", retries=0)
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


def test_a_run_no_trainer_holds_any_more_stops_this_one_too():
    """The reaper queued the run again while this trainer was presumed dead: it is no longer this one's."""
    client = _client_answering(409, _conflict(TrainerConflictCode.RUN_NOT_CLAIMED, "Run 7 is held by no trainer"))

    with pytest.raises(RunTakenOverError, match="held by no trainer"):
        client.heartbeat(7, TrainerHeartbeat(worker="w:1"))


def test_another_conflict_is_not_taken_for_a_takeover_whatever_its_message_says():
    client = _client_answering(409, _conflict("conflict", "held by trainer (sic)"))

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

    def client_of_this_platform(url, token, *, trainer_name, retries=None, server_error_retries=4):
        client = PlatformClient(url, token, trainer_name=trainer_name, retries=0)
        client._http = httpx.Client(base_url=url, transport=httpx.MockTransport(platform))
        return client

    monkeypatch.setattr(trainer_main, "PlatformClient", client_of_this_platform)
    runs = trainer_main.serve(platform_url="http://platform.test", token="t", redis_url=redis_url,
                              checkpoint_root=tmp_path, poll_s=0.01, max_runs=1)

    assert runs == 1
    assert [(beat["status"], "rl_steps" in beat["message"]) for beat in heartbeats] == [("failed", True)]


def test_every_request_names_the_trainer_so_the_platform_can_check_it_holds_the_run():
    seen: list[str] = []

    def platform(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get(TRAINER_HEADER, ""))
        return httpx.Response(202, json={"schema_version": 1, "stored": 0, "trace_requests": []})

    client = PlatformClient("http://platform.test", "token", trainer_name="gpu-1:42", retries=0)
    client._http = httpx.Client(base_url="http://platform.test", headers=client._http.headers,
                                transport=httpx.MockTransport(platform))
    client.post_events(7, [])

    assert seen == ["gpu-1:42"]


def test_a_platform_that_answers_503_is_asked_again_until_it_answers():
    """A restarting platform (a proxy's 503, a refused connection) costs the trainer a wait, never the run."""
    answers = iter([httpx.Response(503), httpx.Response(502)])
    attempts: list[int] = []

    def platform(request: httpx.Request) -> httpx.Response:
        attempts.append(1)
        if len(attempts) == 3:
            raise httpx.ConnectError("refused")
        return next(answers, httpx.Response(200, json={"schema_version": 1, "status": "running"}))

    client = PlatformClient("http://platform.test", "token", trainer_name="w:1")
    client._http = httpx.Client(base_url="http://platform.test", transport=httpx.MockTransport(platform))

    assert client.heartbeat(7, TrainerHeartbeat(worker="w:1")) == RunStatus.RUNNING
    assert len(attempts) == 4


def _event_with_episodes(step: int, count: int, *, reason: str = "", timeline: bool = True) -> TrainerStepEvent:
    episodes = [EpisodeSpan(trajectory_id=f"t{step}-{index}", group_id=f"g{index // 8}", environment="calculator",
                            status="ok", failure_reason=reason, started_at=1.0, finished_at=2.0, generation_s=0.5,
                            environment_s=0.25, policy_version=step, newest_policy_version=step,
                            reward=float(index % 2), outcome="trained") for index in range(count)]
    spans = StepTimeline(spans=[StageSpan(name="compute", started_at=1.0, ended_at=2.0)]) if timeline else None
    return TrainerStepEvent(run_id=7, step=step, phase="rl", policy_version=step, wall_s=1.0, wait_s=0.0,
                            compute_s=1.0, publish_s=0.0, other_s=0.0, loss=0.5, emitted_at=1.0, episodes=episodes,
                            timeline=spans)


def test_a_step_of_thousands_of_episodes_goes_in_posts_the_platform_takes_with_every_episode_once():
    """Before, a step of about 7,400 episodes made one body over Django's 2.5 MiB cap, refused on every try."""
    events = [_event_with_episodes(1, 10), _event_with_episodes(2, 9000), _event_with_episodes(3, 10)]

    bodies = telemetry_posts(events, max_bytes=MAX_TELEMETRY_POST_BYTES)

    assert len(bodies) > 1
    assert all(len(json.dumps(body)) <= MAX_TELEMETRY_POST_BYTES for body in bodies)
    sent_events = [event for body in bodies for event in body["events"]]
    assert [event["step"] for event in sent_events] == [1, 2, 3]
    big = sent_events[1]
    assert big["episodes_total"] == 9000 and 0 < len(big["episodes"]) < 9000
    placed = {index: episode["trajectory_id"] for index, episode in enumerate(big["episodes"])}
    for chunk in (chunk for body in bodies for chunk in body["episode_chunks"]):
        assert chunk["step"] == 2
        for index, episode in enumerate(chunk["episodes"], start=chunk["offset"]):
            assert index not in placed
            placed[index] = episode["trajectory_id"]
    assert placed == {index: f"t2-{index}" for index in range(9000)}
    assert "episodes_total" not in sent_events[0] or sent_events[0]["episodes_total"] is None


def test_posts_are_sized_in_the_bytes_they_take_on_the_wire():
    """A failure reason in CJK takes three bytes a character: counted as characters, bodies overran the cap."""
    events = [_event_with_episodes(1, 3000, reason="错误" * 80)]

    bodies = telemetry_posts(events, max_bytes=MAX_TELEMETRY_POST_BYTES)

    assert len(bodies) > 1
    # As httpx sends it: compact, UTF-8.
    sent = [json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode() for body in bodies]
    assert all(len(body) <= MAX_TELEMETRY_POST_BYTES for body in sent)


def test_a_step_without_a_timeline_sends_no_episodes_the_platform_would_not_keep():
    (body,) = telemetry_posts([_event_with_episodes(1, 10, timeline=False)])

    assert body["events"][0]["episodes"] == [] and body["episode_chunks"] == []


def test_series_the_platform_refused_from_a_stored_post_are_logged_and_counted(caplog):
    reply = {"schema_version": 1, "stored": 11, "trace_requests": [],
             "refused_series": [{"step": 3, "name": "custom/" + "x" * 70, "reason": "longer than 64 characters"}]}
    client = _client_answering(202, reply)
    event = _event_with_episodes(3, 0)

    client.post_events(7, [event])

    assert client.refused_series == 1 and client.refused_posts == 0
    assert "refused 1 series" in caplog.text and "at step 3 (longer than 64 characters)" in caplog.text
