"""Checkpoint exports for real: the export worker (trainer/export_worker.py, queue ``exports``) does the
export and reports back on the platform queue, so the platform worker, with beat inside as ``tandem
platform-worker`` runs it, goes on recording probe reports and reaping dead trainers meanwhile.

While the export runs the test holds the export worker stopped (SIGSTOP to its process group, from
outside: the worker has no pause of its own), so the order is shown by the records, never by timing:
the probe's report is recorded and the dead trainer's run is queued again while the checkpoint is still
``exporting``; once the worker goes on, the export is recorded and its download holds the files.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import zipfile
from collections.abc import Iterator, Mapping
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.utils import timezone

from checkpoints.models import Checkpoint
from common.tasks import send_task
from environment_registry.models import EnvironmentProbe
from runs.models import Run
from runs.services import run_claim_next, run_heartbeat
from tandem.configs.run import RunConfig
from tandem.contracts import (
    EXPORTS_QUEUE,
    PLATFORM_QUEUE,
    PROBE_QUEUE,
    PROBE_REPORT,
    TrainerHeartbeat,
)
from tandem.runtime.process_reports import live_process_reports
from tests.polling import poll_until
from tests.processes import wait_for_celery_ready
from tests.trainer.factories import save_checkpoints
from trainer.checkpoints import RunCheckpointer

from .conftest import probe_report
from .test_checkpoints_api import RUN_CONFIG

REPO_ROOT = Path(__file__).resolve().parents[2]
# A bound for a stuck process (the export worker loads JAX and a model), not a measure of speed.
DEADLINE_S = 180


@contextlib.contextmanager
def _process(command: list[str], *, log: Path, env: Mapping[str, str]) -> Iterator[subprocess.Popen]:
    """``command`` in a process group of its own, ready once its log says so; stopped at the end."""
    with log.open("wb") as log_file:
        process = subprocess.Popen(command, cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **env},
                                   stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_celery_ready(process, log, timeout_s=DEADLINE_S)
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGCONT)
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        print(f"--- {log.name}\n{log.read_text()[-4000:]}")


@pytest.fixture
def workers(transactional_db, redis_client, redis_url, tmp_path):
    """The platform worker of the platform queue with beat (a reaper pass every second), and the export worker."""
    redis_client.delete(EXPORTS_QUEUE, PLATFORM_QUEUE, PROBE_QUEUE)  # nothing left by an earlier session
    db = connection.settings_dict
    platform_env = {
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "TANDEM_TEST_DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "TANDEM_REAPER_INTERVAL_S": "1",
        # Only the run the test made silent long ago is dead; the sweeps stay out of the way.
        "TANDEM_TRAINER_HEARTBEAT_TIMEOUT_S": "3600",
        "TANDEM_HEALTH_CHECK_INTERVAL_S": "3600",
    }
    try:
        with (
            _process([sys.executable, "-m", "tandem.cli", "platform-worker",
                      "--schedule-file", str(tmp_path / "celerybeat-schedule"),
                      "--name", f"platform-test-{os.getpid()}@%h"],
                     log=tmp_path / "platform-worker.log", env=platform_env) as platform_worker,
            _process([sys.executable, "-m", "trainer.export_worker", "--name", f"exports-test-{os.getpid()}@%h"],
                     log=tmp_path / "export-worker.log", env={"REDIS_URL": redis_url}) as export_worker,
        ):
            yield platform_worker, export_worker, tmp_path / "export-worker.log"
    finally:
        redis_client.delete(PROBE_QUEUE)


@pytest.mark.timeout(1500)  # five waits of DEADLINE_S at most, and the fixture's two
def test_probe_reports_and_the_reaper_run_while_an_export_runs(workers, api, trainer_api, make_run, make_project,
                                                               make_environment, project, environment, settings,
                                                               tmp_path, redis_client):
    platform_worker, export_worker, export_log = workers
    # It reports itself for the devices page, as every Tandem process does.
    reported = poll_until(lambda: [report for report in live_process_reports(redis_client)
                                   if report.role == "export_worker"], timeout_s=DEADLINE_S,
                          what="the export worker's process report")
    assert [(report.pid, report.name) for report in reported] == [
        (export_worker.pid, f"exports-test-{os.getpid()}@{reported[0].hostname}")]
    settings.TANDEM_CHECKPOINT_ROOT = tmp_path
    run = make_run(project, environment=environment, config=RUN_CONFIG)
    assert run_claim_next(worker="trainer-host:1").pk == run.pk
    run_heartbeat(run=run, heartbeat=TrainerHeartbeat(worker="trainer-host:1"))
    checkpointer = RunCheckpointer(tmp_path / f"run-{run.pk}", max_to_keep=2)
    save_checkpoints(checkpointer, RunConfig.model_validate(run.config), range(1, 2))
    body = {"checkpoints": [info.model_dump(mode="json") for info in checkpointer.committed_checkpoints()]}
    checkpointer.close()
    assert trainer_api.post(f"/api/trainer/runs/{run.pk}/checkpoints/", body, format="json").status_code == 200

    # A run whose trainer went silent two hours ago, and an environment whose probe has not reported.
    dead = make_run(project, environment=environment, config=RUN_CONFIG)
    assert run_claim_next(worker="dead-trainer:1").pk == dead.pk
    run_heartbeat(run=dead, heartbeat=TrainerHeartbeat(worker="dead-trainer:1"))
    Run.objects.filter(pk=dead.pk).update(heartbeat_at=timezone.now() - timedelta(hours=2))
    probe = make_environment(make_project(), probed=False).versions.get().probes.get()
    assert probe.status == EnvironmentProbe.Status.PENDING

    def alive() -> None:
        for process in (platform_worker, export_worker):
            assert process.poll() is None, "a worker exited"

    started = api.post(f"/api/runs/{run.pk}/checkpoints/1/export/")
    assert started.status_code == 202, started.json()
    checkpoint_id = started.json()["id"]
    # The export worker took the request and is exporting: hold it there.
    poll_until(lambda: f"exporting checkpoint {checkpoint_id}:".encode() in export_log.read_bytes(),
               timeout_s=DEADLINE_S, between=alive, what=lambda: export_log.read_text()[-3000:])
    os.killpg(export_worker.pid, signal.SIGSTOP)
    try:
        holding = Checkpoint.objects.get(pk=checkpoint_id)
        assert holding.export_status == Checkpoint.ExportStatus.EXPORTING, (
            "the export finished before the test could hold it", holding.export_status)

        # A rollout worker's probe report, as it sends it, and beat's reaper: both on the platform queue.
        send_task(PROBE_REPORT, probe_report(probe).model_dump(mode="json"))
        poll_until(lambda: EnvironmentProbe.objects.get(pk=probe.pk).status != EnvironmentProbe.Status.PENDING,
                   timeout_s=DEADLINE_S, between=alive, what="the platform worker to record the probe report")
        poll_until(lambda: Run.objects.get(pk=dead.pk).status != Run.Status.RUNNING, timeout_s=DEADLINE_S,
                   between=alive, what="the reaper to take the dead trainer's run back")
        assert EnvironmentProbe.objects.get(pk=probe.pk).status == EnvironmentProbe.Status.PASSED
        reaped = Run.objects.get(pk=dead.pk)
        assert reaped.status == Run.Status.QUEUED and "dead-trainer:1" in reaped.status_reason
        # All of that while the export was still running.
        assert Checkpoint.objects.get(pk=checkpoint_id).export_status == Checkpoint.ExportStatus.EXPORTING
        assert Run.objects.get(pk=run.pk).status == Run.Status.RUNNING
    finally:
        os.killpg(export_worker.pid, signal.SIGCONT)

    poll_until(lambda: Checkpoint.objects.get(pk=checkpoint_id).export_status != Checkpoint.ExportStatus.EXPORTING,
               timeout_s=DEADLINE_S, between=alive, what=lambda: export_log.read_text()[-3000:])
    checkpoint = Checkpoint.objects.get(pk=checkpoint_id)
    assert checkpoint.export_status == Checkpoint.ExportStatus.EXPORTED, checkpoint.export_error
    response = api.get(f"/api/runs/{run.pk}/checkpoints/1/download/")
    assert response.status_code == 200
    with zipfile.ZipFile(io.BytesIO(b"".join(response.streaming_content))) as archive:
        assert sorted(archive.namelist()) == ["config.json", "model.safetensors"]
