"""A failed run's log, end to end: its trainer's traceback and its producers' lines reach the platform, attributed.

The run's environment demonstrates for its probe and raises for the SFT phase's batches, so a
producer logs the failure of the demonstrations task and the trainer fails the run with a
traceback; the platform worker's beat drains both into the run's log.
"""

from __future__ import annotations

from tests.e2e.conftest import run_ended, user_api
from tests.e2e.test_demonstrations import _register_and_run
from tests.polling import poll_until


def test_a_failed_runs_traceback_and_its_producers_lines_are_in_its_log(stack, credentials):
    local, _ = stack
    api = user_api(local, credentials)

    run_id = _register_and_run(api, credentials, name="broken-demonstrator-logs",
                               entrypoint="tests.e2e.demonstration_environments:BrokenDemonstratorEnvironment")
    run = run_ended(local, api, run_id, timeout_s=300)
    assert run["status"] == "failed", run["status_reason"]

    def failure_lines() -> list[dict] | None:
        lines = api.get(f"/api/runs/{run_id}/logs/", params={"level": "error", "process": "trainer"}).json()["lines"]
        return [line for line in lines if line["traceback"]] or None

    # The beat task drains every couple of seconds; the trainer logged before it reported the failure.
    (failure, *_) = poll_until(failure_lines, timeout_s=60, interval_s=1.0, what="the trainer's traceback")
    assert failure["message"] == f"run {run_id} failed"
    assert failure["logger"] == "tandem.trainer"
    assert failure["traceback"].startswith("Traceback (most recent call last):")
    assert "DemonstrationsFailedError: the demonstrations of SFT step 1 failed" in failure["traceback"]
    trainer = local.processes["trainer"]
    assert failure["pid"] == trainer.pid

    # The producer that ran the demonstrations task logged its failure into the run's log too.
    # It may reach the run's log a drain after the trainer's lines did (each process logs to the stream
    # on a thread of its own), so it is waited for too.
    def producer_failure_lines() -> list[dict] | None:
        lines = api.get(f"/api/runs/{run_id}/logs/", params={"process": "rollout_worker"}).json()["lines"]
        return [line for line in lines if "demonstrations of SFT step 0 failed" in line["message"]] or None  # 0-based

    worker_pids = {process.pid for name, process in local.processes.items() if name.startswith("worker-")}
    failed = poll_until(producer_failure_lines, timeout_s=60, interval_s=1.0, what=lambda: "the producer's line: " + str(
        [line["message"] for line in api.get(f"/api/runs/{run_id}/logs/", params={"process": "rollout_worker"}).json()["lines"]]))
    assert failed[0]["level"] == "WARNING" and failed[0]["pid"] in worker_pids
    assert "the demonstrator is broken" in failed[0]["message"]

    # The download holds them both.
    text = api.get(f"/api/runs/{run_id}/logs.txt").text
    assert f"tandem.trainer: run {run_id} failed" in text and "the demonstrator is broken" in text
    local.check_alive()
