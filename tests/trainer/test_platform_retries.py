"""A platform answer that keeps failing fails its request after bounded retries, and a cancel is seen meanwhile.

The platform here is a real HTTP server (http.server on loopback) that answers every page of a
dataset's rows with a 500, as the platform does for a version whose stored rows it cannot encode.
"""

from __future__ import annotations

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tandem.contracts import RunStatus, TrainerHeartbeat
from trainer.datasets import load_dataset
from trainer.main import SET_ASIDE_S, set_aside_seconds
from trainer.platform_client import PlatformClient, PlatformRequestFailedError

# The platform's 500 of a rows page it cannot render: Django's plain answer, no JSON.
SERVER_ERROR_BODY = b"<h1>Server Error (500)</h1>"


class BrokenDatasetPlatform:
    """Answers every rows page with a 500, and heartbeats with the run's status (cancelled from the
    ``cancel_after``-th page request on); counts the requests."""

    def __init__(self, *, cancel_after: int | None = None):
        self.row_requests = 0
        self.heartbeats = 0
        self.cancel_after = cancel_after
        self._lock = threading.Lock()

    def status(self) -> str:
        cancelled = self.cancel_after is not None and self.row_requests >= self.cancel_after
        return RunStatus.CANCELLED if cancelled else RunStatus.RUNNING

    def handler(self):
        platform = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                with platform._lock:
                    platform.row_requests += 1
                self.send_response(500)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(SERVER_ERROR_BODY)))
                self.end_headers()
                self.wfile.write(SERVER_ERROR_BODY)

            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with platform._lock:
                    platform.heartbeats += 1
                body = json.dumps({"schema_version": 1, "status": platform.status()}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        return Handler


@contextlib.contextmanager
def serving(platform: BrokenDatasetPlatform):
    server = ThreadingHTTPServer(("127.0.0.1", 0), platform.handler())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class RunCancelled(Exception):
    pass


@pytest.mark.timeout(60)
def test_a_rows_page_the_platform_fails_every_time_fails_naming_its_url_status_and_reason():
    """Before, ``_get`` asked again for as long as the platform answered 500: the trainer never let go."""
    platform = BrokenDatasetPlatform()
    with serving(platform) as url:
        client = PlatformClient(url, "token", trainer_name="w:1", server_error_retries=2)
        try:
            with pytest.raises(PlatformRequestFailedError) as failed:
                load_dataset(client, 7, name="support", version=3, weight=1.0, tool_call_format="hermes")
        finally:
            client.close()

    assert platform.row_requests == 3  # the first try and two retries
    message = str(failed.value)
    assert f"GET {url}/api/trainer/runs/7/datasets/support/versions/3/rows/" in message
    assert "HTTP 500 on all 3 tries" in message and "Server Error (500)" in message
    assert failed.value.response.status_code == 500


@pytest.mark.timeout(60)
def test_a_cancel_is_seen_between_the_retries_of_a_page_the_platform_keeps_failing():
    """Before, the retries never ran the run's heartbeat: a cancelled run's trainer kept asking."""
    platform = BrokenDatasetPlatform(cancel_after=3)
    with serving(platform) as url:
        client = PlatformClient(url, "token", trainer_name="w:1", server_error_retries=10_000)

        def heartbeat() -> None:  # what RunTrainer._heartbeat does with the platform's answer
            if client.heartbeat(7, TrainerHeartbeat(status=RunStatus.RUNNING, worker="w:1")) == RunStatus.CANCELLED:
                raise RunCancelled()

        try:
            with pytest.raises(RunCancelled):
                load_dataset(client, 7, name="support", version=3, weight=1.0, tool_call_format="hermes",
                             between_pages=heartbeat)
        finally:
            client.close()

    # One heartbeat after each failed page; the third found the run cancelled, and nothing was asked after it.
    assert platform.row_requests == 3 and platform.heartbeats == 3


def test_the_set_aside_of_a_run_is_read_in_seconds_and_a_bad_setting_is_refused_naming_it():
    """TANDEM_TRAINER_SET_ASIDE_S: how long a run whose data the platform kept failing waits in the queue."""
    assert set_aside_seconds(None) == set_aside_seconds("") == SET_ASIDE_S
    assert set_aside_seconds("0") == 0 and set_aside_seconds("90.5") == 90.5
    for bad in ("-1", "soon", "nan", "inf", "86401"):
        with pytest.raises(ValueError, match="TANDEM_TRAINER_SET_ASIDE_S"):
            set_aside_seconds(bad)
