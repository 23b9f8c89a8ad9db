"""The owners of a run's reports beside its training loop: checkpoints and evaluations reach the
platform once each, and a platform that was away gets them later without training ever waiting.

The platform here is a real HTTP server on loopback that answers the first posts of each route
with a 503, as a platform behind a restarting proxy does, and records the bodies it took.
"""

from __future__ import annotations

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler

import pytest

from tandem.configs.evaluation import EvaluationConfig, EvaluationDatasetConfig
from tandem.configs.run import RunConfig
from tandem.contracts import CheckpointInfo, DatasetRowsPage, EnvironmentSpec
from trainer.checkpoint_reports import CheckpointReporter
from trainer.datasets import load_dataset
from trainer.platform_client import ClaimedRun, PlatformClient
from trainer.run_evaluation import RunEvaluation

from .test_platform_retries import serving


class FlakyPlatform:
    """Answers the first ``unavailable`` posts to each path with a 503, then takes them (a 200)."""

    def __init__(self, *, unavailable: int):
        self.unavailable = unavailable
        self.refused: dict[str, int] = {}
        self.taken: dict[str, list[dict]] = {}
        self._lock = threading.Lock()

    def handler(self):
        platform = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                with platform._lock:
                    refused = platform.refused.get(self.path, 0)
                    if refused < platform.unavailable:
                        platform.refused[self.path] = refused + 1
                        status = 503
                    else:
                        platform.taken.setdefault(self.path, []).append(body)
                        status = 200
                answer = b"{}"
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        return Handler


@contextlib.contextmanager
def platform_client(platform: FlakyPlatform):
    with serving(platform) as url:
        client = PlatformClient(url, "token", trainer_name="w:1")
        try:
            yield client
        finally:
            client.close()


def _checkpoint(step: int) -> CheckpointInfo:
    return CheckpointInfo(step=step, policy_version=step, path=f"/checkpoints/run-7/{step}", size_bytes=1024)


@pytest.mark.timeout(60)
def test_a_new_commit_is_reported_once_and_a_refused_report_waits_its_retry_delay():
    on_disk = [_checkpoint(2)]
    platform = FlakyPlatform(unavailable=1)
    with platform_client(platform) as client:
        reporter = CheckpointReporter(client, 7, committed_checkpoints=lambda: list(on_disk), retry_s=3600)
        reporter.committed(None)
        reporter.committed(2)  # refused: not tried again within the delay
        reporter.committed(2)
        assert reporter.reported_step is None

        reporter = CheckpointReporter(client, 7, committed_checkpoints=lambda: list(on_disk), retry_s=0)
        reporter.committed(2)
        reporter.committed(2)  # already reported
        on_disk.append(_checkpoint(4))
        reporter.committed(4)

    route = "/api/trainer/runs/7/checkpoints/"
    assert platform.refused == {route: 1}
    assert [[checkpoint["step"] for checkpoint in body["checkpoints"]] for body in platform.taken[route]] == [
        [2], [2, 4]]
    assert reporter.reported_step == 4


class RowsPlatform:
    """The platform's trainer route for a dataset's rows: none of them held out."""

    def dataset_rows(self, run_id, name, version, *, offset, limit, between_retries=lambda: None):
        rows = [{"messages": [{"role": "user", "content": "a?"}, {"role": "assistant", "content": "b"}],
                 "metadata": {"split": "train"}}] * 3
        return DatasetRowsPage(dataset=name, version=version, offset=offset, total=len(rows),
                               rows=rows[offset:offset + limit])


@pytest.mark.timeout(60)
def test_an_evaluation_the_platform_missed_is_posted_after_the_next_step_and_only_at_its_points():
    config = RunConfig.model_validate({
        "rl_steps": 4, "evaluation": EvaluationConfig(
            environment=False, every_steps=2,
            datasets=[EvaluationDatasetConfig(name="small", version=1)]).model_dump()})
    claimed = ClaimedRun(run_id=7, name="r", config=config,
                         environment=EnvironmentSpec(name="calculator", kind="python",
                                                     entrypoint="tests.workers.maze:MazeEnvironment"))
    loaded = []

    def load(name, version):
        loaded.append((name, version))
        return load_dataset(RowsPlatform(), 7, name=name, version=version, weight=1.0, tool_call_format="tandem")

    platform = FlakyPlatform(unavailable=1)
    with platform_client(platform) as client:
        evaluation = RunEvaluation(
            claimed, platform=client, redis_client=None, celery_app=None,
            publish_kept=lambda version, key: None, load_dataset=load, render=lambda rows: iter(()),
            score=lambda batch: None, trajectories=None)
        assert evaluation.configured
        route = "/api/trainer/runs/7/evaluations/"

        evaluation.evaluate_if_due(rl_steps_done=0, step=10, policy_version=1)  # a point: refused, kept
        assert platform.refused == {route: 1} and route not in platform.taken
        evaluation.evaluate_if_due(rl_steps_done=1, step=11, policy_version=2)  # not a point
        evaluation.after_step()
        assert [body["step"] for body in platform.taken[route]] == [10]

        evaluation.evaluate_if_due(rl_steps_done=2, step=12, policy_version=3)
        evaluation.finish(between=lambda: None)

    reports = platform.taken[route]
    assert [(report["evaluation"], report["step"], report["policy_version"]) for report in reports] == [
        (0, 10, 1), (1, 12, 3)]
    assert all(report["status"] == "incomplete" and "has no held-out rows" in report["reason"] for report in reports)
    assert loaded == [("small", 1)]  # loaded once, at the first point
