"""The run page's Logs panel in real Chromium against a real uvicorn: lines arrive live, search filters them,
and a failed run shows its traceback beside its status reason."""

from __future__ import annotations

import threading
import time

import pytest
import redis
from django.conf import settings
from django.db import connection
from playwright.sync_api import sync_playwright

from run_logs.services import run_logs_drain
from runs.models import Run
from runs.services import run_transition
from tandem.contracts import RunLogRecord, RunStatus, run_log_stream
from tests.browser import launch_chromium, log_in

pytestmark = pytest.mark.django_db(transaction=True)

WAIT_MS = 10_000  # bounds every wait on the page's state; none of them is a measurement


def _console_errors(message) -> list[str]:
    if message.type != "error" or message.location.get("url", "").endswith("/favicon.ico"):
        return []
    return [f"{message.text} ({message.location.get('url')})"]


def _in_another_thread(work) -> None:
    """``work()`` with the ORM, off the thread where Playwright's event loop runs (as the platform worker would)."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            failure.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


def _log_and_drain(run_id: int, records: list[tuple[str, str, str]]) -> None:
    """The run's trainer logs ``(level, message, traceback)`` records, and the platform drains them."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    try:
        for level, message, traceback in records:
            record = RunLogRecord(run_id=run_id, created=time.time(), level=level, logger="tandem.trainer",
                                  message=message, traceback=traceback, role="trainer", hostname="trainer-host",
                                  pid=100)
            client.xadd(run_log_stream(run_id), record.to_stream_fields())
    finally:
        client.close()
    _in_another_thread(run_logs_drain)


def _shown(page) -> list[str]:
    return page.eval_on_selector_all("#run-logs-lines .run-log-message", "nodes => nodes.map(n => n.textContent)")


def test_log_lines_appear_live_and_search_filters_them(server, running_run):
    redis.Redis.from_url(settings.REDIS_URL).delete(run_log_stream(running_run.pk))
    _log_and_drain(running_run.pk, [("INFO", "claimed run", "")])

    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on("console", lambda message: errors.extend(_console_errors(message)))
        log_in(page, server, f"/runs/{running_run.pk}/", username="alice", password="pw")
        page.on("framenavigated", lambda frame: errors.append(f"the page navigated to {frame.url}"))
        page.wait_for_function("() => window.tandemRunLogs && window.tandemRunLogs.shown === 1", timeout=WAIT_MS)
        page.wait_for_function("() => window.tandemRunLogs.socket && window.tandemRunLogs.socket.readyState === 1",
                               timeout=WAIT_MS)
        assert _shown(page) == ["claimed run"]
        assert page.is_hidden("#run-logs-empty")

        # New lines arrive over the socket's notice and a fetch after the cursor: no reload.
        _log_and_drain(running_run.pk, [("INFO", "step 1: loss 0.52", ""), ("WARNING", "episode failed: timeout", ""),
                                        ("INFO", "step 2: loss 0.47", "")])
        page.wait_for_function("() => window.tandemRunLogs.shown === 4", timeout=WAIT_MS)
        assert _shown(page) == ["claimed run", "step 1: loss 0.52", "episode failed: timeout", "step 2: loss 0.47"]
        assert page.evaluate("window.tandemRunLogs.notices") >= 1
        assert page.get_attribute('#run-logs-lines [data-level="warning"] .run-log-level', "class") == "run-log-level"

        # Search filters them (over the API), and live lines that do not match stay out.
        page.fill("#run-logs-search", "loss")
        page.wait_for_function("() => window.tandemRunLogs.shown === 2", timeout=WAIT_MS)
        assert _shown(page) == ["step 1: loss 0.52", "step 2: loss 0.47"]
        _log_and_drain(running_run.pk, [("INFO", "checkpoint 2 written", ""), ("INFO", "step 3: loss 0.41", "")])
        page.wait_for_function("() => window.tandemRunLogs.shown === 3", timeout=WAIT_MS)
        assert _shown(page) == ["step 1: loss 0.52", "step 2: loss 0.47", "step 3: loss 0.41"]
        page.select_option("#run-logs-level", "warning")
        page.fill("#run-logs-search", "")
        page.wait_for_function("() => window.tandemRunLogs.shown === 1", timeout=WAIT_MS)
        assert _shown(page) == ["episode failed: timeout"]
        assert page.get_attribute("#run-logs-download", "href") == f"/api/runs/{running_run.pk}/logs.txt"

        # The run fails: its traceback and last lines show beside its status reason, live.
        assert page.is_hidden("#run-failure-logs")
        _log_and_drain(running_run.pk, [("ERROR", "run failed", "Traceback (most recent call last):\n  ...\n"
                                                                  "CheckpointError: step 40 is corrupt")])
        _in_another_thread(lambda: run_transition(run=Run.objects.get(pk=running_run.pk), to_status=RunStatus.FAILED,
                                                  reason="trainer error: CheckpointError: step 40 is corrupt"))
        page.wait_for_function("() => window.tandemRunLogs.failureShown", timeout=WAIT_MS)
        assert page.text_content("#run-failure-traceback").endswith("CheckpointError: step 40 is corrupt")
        assert "ERROR trainer trainer-host:100 tandem.trainer: run failed" in page.text_content("#run-failure-tail")
        page.screenshot(path=_artifact("run_logs_panel.png"), full_page=True)

        assert errors == []
        browser.close()


def _artifact(name: str) -> str:
    from pathlib import Path

    directory = Path(__file__).resolve().parents[2] / "test-artifacts"
    directory.mkdir(exist_ok=True)
    return str(directory / name)
