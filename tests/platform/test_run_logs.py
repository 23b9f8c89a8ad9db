"""Run logs on the platform: drained from the runs' Redis streams, capped, read by cursor, filters and search.

The records are written to the stream as the trainer's and producers' shipper writes them
(tandem.runtime.run_logs.RunLogShipper, on real Redis), and drained by the beat task's service.
"""

from __future__ import annotations

import logging
import time

import pytest
import redis
from django.conf import settings

from run_logs.models import RunLogLine, RunLogState
from run_logs.services import run_logs_drain
from runs.services import run_transition
from tandem.contracts import RunLogRecord, RunStatus, run_log_stream
from tandem.runtime.run_logs import RunLogShipper, run_log_scope

TRAINER_HOST, WORKER_HOST = "trainer-host", "worker-host"


@pytest.fixture
def redis_client():
    client = redis.Redis.from_url(settings.REDIS_URL)
    yield client
    client.close()


@pytest.fixture
def stream_of(redis_client):
    """The run's stream, empty to begin with (ids repeat across test databases) and deleted afterwards."""
    streams: list[str] = []

    def make(run) -> str:
        stream = run_log_stream(run.pk)
        redis_client.delete(stream)
        streams.append(stream)
        return stream

    yield make
    if streams:
        redis_client.delete(*streams)


def _record(run, message: str, *, level: str = "INFO", role: str = "trainer", hostname: str = TRAINER_HOST,
            pid: int = 100, logger: str = "tandem.trainer", traceback: str = "") -> RunLogRecord:
    return RunLogRecord(run_id=run.pk, created=time.time(), level=level, logger=logger, message=message,
                        traceback=traceback, role=role, hostname=hostname, pid=pid)


def _ship(redis_client, run, *records: RunLogRecord) -> None:
    for record in records:
        redis_client.xadd(run_log_stream(run.pk), record.to_stream_fields())


@pytest.fixture
def logged(redis_client, running_run, stream_of):
    """A running run with a trainer's and two producers' lines, stored by one drain."""
    stream_of(running_run)
    _ship(redis_client, running_run,
          _record(running_run, "claimed run"),
          _record(running_run, "episode failed: tool timed out", level="WARNING", role="rollout_worker",
                  hostname=WORKER_HOST, pid=201, logger="workers.producer"),
          _record(running_run, "groups 0..3 produced", role="rollout_worker", hostname=WORKER_HOST, pid=202,
                  logger="celery.app.trace"),
          _record(running_run, "run failed", level="ERROR",
                  traceback="Traceback (most recent call last):\n  ...\nCheckpointError: step 40 is corrupt"),
          _record(running_run, "checkpoint written", level="DEBUG"))
    assert run_logs_drain() == {running_run.pk: 5}
    return running_run


def _messages(response) -> list[str]:
    assert response.status_code == 200, response.content
    return [line["message"] for line in response.json()["lines"]]


def test_the_drain_stores_each_record_attributed_and_empties_the_stream(logged, redis_client, api):
    page = api.get(f"/api/runs/{logged.pk}/logs/").json()

    assert [line["message"] for line in page["lines"]] == [
        "claimed run", "episode failed: tool timed out", "groups 0..3 produced", "run failed", "checkpoint written"]
    failure = page["lines"][3]
    assert {key: failure[key] for key in ("level", "role", "hostname", "pid", "logger")} == {
        "level": "ERROR", "role": "trainer", "hostname": TRAINER_HOST, "pid": 100, "logger": "tandem.trainer"}
    assert failure["traceback"].endswith("CheckpointError: step 40 is corrupt")
    assert (page["next_after"], page["has_more"]) == (page["lines"][-1]["id"], False)
    assert (page["lines_kept"], page["lines_deleted"], page["lines_lost"]) == (5, 0, 0)
    # Stored lines leave the stream; a second drain stores nothing again.
    assert redis_client.xlen(run_log_stream(logged.pk)) == 0
    assert run_logs_drain() == {}
    assert RunLogLine.objects.filter(run=logged).count() == 5


def test_records_a_real_shipper_sends_are_stored_with_their_process(running_run, redis_client, stream_of, api):
    stream_of(running_run)
    subject = logging.getLogger("tests.platform.run_logs.subject")
    subject.propagate = False
    shipper = RunLogShipper(redis_client=redis.Redis.from_url(settings.REDIS_URL), role="trainer",
                            flush_interval_s=3600)
    subject.addHandler(shipper)
    try:
        with run_log_scope(running_run.pk):
            subject.warning("learning rate warmed up to %s", 3e-4)
    finally:
        subject.removeHandler(shipper)
        shipper.close()

    run_logs_drain()

    (line,) = api.get(f"/api/runs/{running_run.pk}/logs/").json()["lines"]
    assert (line["message"], line["level"], line["logger"], line["role"]) == (
        "learning rate warmed up to 0.0003", "WARNING", "tests.platform.run_logs.subject", "trainer")


def test_an_ended_run_is_drained_for_a_while_and_an_unreadable_entry_says_so(running_run, redis_client, stream_of,
                                                                            api):
    stream_of(running_run)
    run_transition(run=running_run, to_status=RunStatus.FAILED, reason="trainer error: CheckpointError")
    _ship(redis_client, running_run, _record(running_run, "late producer line", role="rollout_worker"))
    redis_client.xadd(run_log_stream(running_run.pk), {"schema_version": "99", "payload": '{"schema_version": 99}'})

    run_logs_drain()

    lines = api.get(f"/api/runs/{running_run.pk}/logs/").json()["lines"]
    assert lines[0]["message"] == "late producer line"
    assert lines[1]["level"] == "WARNING" and lines[1]["role"] == "platform"
    assert "could not be read" in lines[1]["message"] and "schema_version 99" in lines[1]["message"]


def test_past_the_cap_the_oldest_lines_are_deleted_and_counted(running_run, redis_client, stream_of, api, settings):
    settings.TANDEM_RUN_LOG_LINES_MAX = 4
    stream_of(running_run)
    _ship(redis_client, running_run, *(_record(running_run, f"line {index}") for index in range(3)))
    run_logs_drain()
    _ship(redis_client, running_run, *(_record(running_run, f"line {index}") for index in range(3, 7)))
    run_logs_drain()

    page = api.get(f"/api/runs/{running_run.pk}/logs/").json()
    assert [line["message"] for line in page["lines"]] == ["line 3", "line 4", "line 5", "line 6"]
    assert (page["lines_kept"], page["lines_deleted"]) == (4, 3)
    download = api.get(f"/api/runs/{running_run.pk}/logs.txt")
    text = b"".join(download.streaming_content).decode()
    assert "# 3 older lines were deleted to keep the run under TANDEM_RUN_LOG_LINES_MAX" in text
    assert "line 2" not in text and "line 6" in text


def test_entries_redis_trimmed_before_the_drain_are_counted_lost(running_run, redis_client, stream_of, api):
    stream = stream_of(running_run)
    _ship(redis_client, running_run, *(_record(running_run, f"line {index}") for index in range(5)))
    run_logs_drain()
    _ship(redis_client, running_run, *(_record(running_run, f"line {index}") for index in range(5, 12)))
    redis_client.xtrim(stream, maxlen=4, approximate=False)  # what the stream's MAXLEN does under a flood

    run_logs_drain()

    page = api.get(f"/api/runs/{running_run.pk}/logs/").json()
    assert [line["message"] for line in page["lines"]][-4:] == ["line 8", "line 9", "line 10", "line 11"]
    assert page["lines_lost"] == 3
    assert RunLogState.objects.get(run=running_run).lines_lost == 3


def test_the_lowest_level_process_and_text_filter_the_lines(logged, api):
    url = f"/api/runs/{logged.pk}/logs/"

    assert _messages(api.get(url, {"level": "warning"})) == ["episode failed: tool timed out", "run failed"]
    assert _messages(api.get(url, {"level": "ERROR"})) == ["run failed"]
    assert _messages(api.get(url, {"process": "rollout_worker"})) == [
        "episode failed: tool timed out", "groups 0..3 produced"]
    assert _messages(api.get(url, {"process": f"{WORKER_HOST}:202"})) == ["groups 0..3 produced"]
    # Text in the message, the traceback or the logger's name, whatever its case.
    assert _messages(api.get(url, {"q": "TIMED OUT"})) == ["episode failed: tool timed out"]
    assert _messages(api.get(url, {"q": "checkpointerror"})) == ["run failed"]
    assert _messages(api.get(url, {"q": "celery.app"})) == ["groups 0..3 produced"]
    assert _messages(api.get(url, {"q": "timed out", "process": "trainer"})) == []
    response = api.get(url, {"level": "loud"})
    assert response.status_code == 400 and list(response.json()["error"]["fields"]) == ["level"]


def test_pages_follow_the_cursor_forwards_and_the_tail_backwards(logged, api):
    url = f"/api/runs/{logged.pk}/logs/"

    tail = api.get(url, {"limit": 2}).json()
    assert [line["message"] for line in tail["lines"]] == ["run failed", "checkpoint written"]
    assert tail["has_more"] is True  # older lines before it
    first_id = tail["lines"][0]["id"]
    older = api.get(url, {"limit": 2, "before": first_id}).json()
    assert [line["message"] for line in older["lines"]] == ["episode failed: tool timed out", "groups 0..3 produced"]

    start = api.get(url, {"after": 0, "limit": 3}).json()
    assert [line["message"] for line in start["lines"]] == [
        "claimed run", "episode failed: tool timed out", "groups 0..3 produced"]
    assert start["has_more"] is True
    rest = api.get(url, {"after": start["next_after"], "limit": 3}).json()
    assert [line["message"] for line in rest["lines"]] == ["run failed", "checkpoint written"]
    assert rest["has_more"] is False
    # Nothing newer yet: the same cursor comes back.
    empty = api.get(url, {"after": rest["next_after"]}).json()
    assert (empty["lines"], empty["next_after"], empty["has_more"]) == ([], rest["next_after"], False)
    response = api.get(url, {"limit": 5000})
    assert response.status_code == 400 and list(response.json()["error"]["fields"]) == ["limit"]


def test_the_download_holds_every_kept_line_with_its_traceback(logged, api):
    response = api.get(f"/api/runs/{logged.pk}/logs.txt")

    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response["Content-Disposition"] == f'attachment; filename="run-{logged.pk}-logs.txt"'
    text = b"".join(response.streaming_content).decode()
    rows = text.splitlines()
    assert rows[0] == f"# run {logged.pk}: 5 lines kept"
    assert f"ERROR    trainer {TRAINER_HOST}:100 tandem.trainer: run failed" in rows[4]
    assert rows[5:8] == ["    Traceback (most recent call last):", "      ...", "    CheckpointError: step 40 is corrupt"]
    assert rows[8].endswith("DEBUG    trainer trainer-host:100 tandem.trainer: checkpoint written")


def test_a_viewer_reads_the_logs_and_another_projects_user_gets_404(logged, project, make_user, client_for):
    from accounts.services import membership_add

    viewer, outsider = make_user(), make_user()
    membership_add(project=project, user=viewer, role="viewer")

    assert client_for(viewer).get(f"/api/runs/{logged.pk}/logs/").status_code == 200
    assert client_for(viewer).get(f"/api/runs/{logged.pk}/logs.txt").status_code == 200
    for path in (f"/api/runs/{logged.pk}/logs/", f"/api/runs/{logged.pk}/logs.txt"):
        response = client_for(outsider).get(path)
        assert response.status_code == 404, path
        assert response.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize("lines", [1, 40])
def test_a_page_of_lines_takes_a_fixed_number_of_queries(running_run, redis_client, stream_of, api, lines,
                                                         django_assert_num_queries):
    stream_of(running_run)
    _ship(redis_client, running_run, *(_record(running_run, f"line {index}", level="WARNING")
                                       for index in range(lines)))
    run_logs_drain()
    api.get(f"/api/runs/{running_run.pk}/logs/")  # records the token's last use, a write once a minute

    # Authentication (the token with its user), the run in the user's scope, the lines, the counters.
    with django_assert_num_queries(4):
        response = api.get(f"/api/runs/{running_run.pk}/logs/", {"level": "warning", "q": "line"})
    assert len(response.json()["lines"]) == lines
