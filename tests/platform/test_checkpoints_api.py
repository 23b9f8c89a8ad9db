"""Checkpoints: the trainer's reports under retention, safetensors export and download, deletion, roles."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from checkpoints.models import Checkpoint
from checkpoints.services import checkpoint_export_request
from checkpoints.tasks import record_checkpoint_export
from policy.hf import load_hf_checkpoint
from runs.services import run_claim_next, run_heartbeat
from tandem.configs.run import RunConfig
from tandem.contracts import CheckpointReport, TrainerHeartbeat
from tests.trainer.factories import save_checkpoints
from trainer.checkpoints import RunCheckpointer
from trainer.export_worker import run_export

RUN_CONFIG = {"model": {"d_model": 32, "num_layers": 2, "num_heads": 2, "mlp_dim": 64, "max_seq_len": 32},
              "checkpoint": {"kept": 2}, "sft_steps": 2, "rl_steps": 2}


@pytest.fixture
def run(make_run, project, environment):
    """A running run of alice's project with the tiny model."""
    made = make_run(project, environment=environment, config=RUN_CONFIG)
    assert run_claim_next(worker="trainer-host:1").pk == made.pk
    return run_heartbeat(run=made, heartbeat=TrainerHeartbeat(worker="trainer-host:1"))


@pytest.fixture(autouse=True)
def checkpoint_root(settings, tmp_path):
    settings.TANDEM_CHECKPOINT_ROOT = tmp_path
    return tmp_path


@pytest.fixture
def checkpointer(run, tmp_path):
    config = RunConfig.model_validate(run.config)
    made = RunCheckpointer(tmp_path / f"run-{run.pk}", max_to_keep=config.checkpoint.kept)
    yield made
    made.close()


def _report(trainer_api, run, checkpointer) -> list[dict]:
    """What the trainer posts after a commit."""
    report = CheckpointReport(checkpoints=checkpointer.committed_checkpoints())
    response = trainer_api.post(f"/api/trainer/runs/{run.pk}/checkpoints/", report.model_dump(mode="json"),
                                format="json")
    assert response.status_code == 200, response.json()
    return response.json()


def _listed(api, run) -> list[tuple]:
    response = api.get(f"/api/runs/{run.pk}/checkpoints/")
    assert response.status_code == 200, response.json()
    return [(c["step"], c["policy_version"], c["status"], c["deleted_reason"]) for c in response.json()["results"]]


def test_reports_follow_retention(api, trainer_api, run, checkpointer):
    config = RunConfig.model_validate(run.config)
    save_checkpoints(checkpointer, config, range(1, 3))
    assert [c["step"] for c in _report(trainer_api, run, checkpointer)] == [2, 1]
    assert _listed(api, run) == [(2, 20, "available", ""), (1, 10, "available", "")]

    save_checkpoints(checkpointer, config, range(3, 4))
    _report(trainer_api, run, checkpointer)
    assert _listed(api, run) == [(3, 30, "available", ""), (2, 20, "available", ""), (1, 10, "deleted", "retention")]
    step_3 = Checkpoint.objects.get(run=run, step=3)
    assert Path(step_3.path) == checkpointer.step_directory(3) and step_3.size_bytes > 0


@pytest.mark.parametrize("where", ["run-{other}/4", "elsewhere/run-{run}/4", "run-{run}/link/4",
                                   "run-{run}/../run-{other}/4"])
def test_a_reported_checkpoint_outside_its_runs_directory_under_the_root_is_400(
    trainer_api, run, checkpoint_root, tmp_path_factory, where
):
    # Another run's directory, a directory outside the root, a link out of it: a report
    # naming one would later let the web process delete it (shutil.rmtree).
    outside = tmp_path_factory.mktemp("outside")
    (checkpoint_root / f"run-{run.pk}").mkdir(exist_ok=True)
    link = checkpoint_root / f"run-{run.pk}" / "link"
    if not link.exists():
        link.symlink_to(outside)
    path = checkpoint_root / where.format(run=run.pk, other=run.pk + 1)
    body = {"checkpoints": [{"step": 4, "policy_version": 1, "path": str(path), "size_bytes": 1}]}

    response = trainer_api.post(f"/api/trainer/runs/{run.pk}/checkpoints/", body, format="json")
    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["checkpoints.0.path"]
    assert not Checkpoint.objects.filter(run=run).exists()


def test_a_report_with_a_foreign_path_is_400_naming_the_field(trainer_api, run):
    body = {"checkpoints": [{"step": 4, "policy_version": 1, "path": "/etc", "size_bytes": 1}]}
    response = trainer_api.post(f"/api/trainer/runs/{run.pk}/checkpoints/", body, format="json")
    assert response.status_code == 400
    assert "checkpoints.0.path" in response.json()["error"]["fields"]
    assert not Checkpoint.objects.filter(run=run).exists()


def test_export_then_download_gives_the_checkpoints_parameters(api, trainer_api, run, checkpointer, tmp_path):
    states = save_checkpoints(checkpointer, RunConfig.model_validate(run.config), range(1, 3))
    _report(trainer_api, run, checkpointer)
    download = f"/api/runs/{run.pk}/checkpoints/1/download/"
    assert api.get(download).status_code == 404

    started = api.post(f"/api/runs/{run.pk}/checkpoints/1/export/")
    assert started.status_code == 202, started.json()
    assert started.json()["export_status"] == "exporting"
    assert api.post(f"/api/runs/{run.pk}/checkpoints/1/export/").status_code == 409
    # What the export worker runs on the request it is sent, then the platform worker on its report
    # (tests/platform/test_checkpoint_export_worker.py runs both as processes).
    report = run_export(checkpoint_export_request(Checkpoint.objects.get(pk=started.json()["id"])))
    assert (report.status, report.files) == ("exported", ("config.json", "model.safetensors")), report.error
    assert report.size_bytes > 0
    assert record_checkpoint_export(report.model_dump(mode="json")) == "exported"
    detail = api.get(f"/api/runs/{run.pk}/checkpoints/1/").json()
    assert detail["export_status"] == "exported" and detail["download_url"].endswith(download)

    response = api.get(download)
    assert response.status_code == 200 and response["Content-Type"] == "application/zip"
    with zipfile.ZipFile(io.BytesIO(b"".join(response.streaming_content))) as archive:
        assert sorted(archive.namelist()) == ["config.json", "model.safetensors"]
        archive.extractall(tmp_path / "downloaded")
    loaded = load_hf_checkpoint(tmp_path / "downloaded", param_dtype="float32", max_seq_len=32)
    loaded_leaves = dict(jax.tree.leaves_with_path(nnx.to_pure_dict(nnx.state(loaded, nnx.Param))))
    saved_leaves = jax.tree.leaves_with_path(nnx.to_pure_dict(states[1].params))
    assert len(saved_leaves) == len(loaded_leaves)
    for path, value in saved_leaves:
        np.testing.assert_array_equal(np.asarray(loaded_leaves[path]), np.asarray(value), err_msg=str(path))


def test_a_failed_export_shows_why_and_can_be_tried_again(api, trainer_api, run, checkpointer):
    save_checkpoints(checkpointer, RunConfig.model_validate(run.config), range(1, 2))
    _report(trainer_api, run, checkpointer)
    started = api.post(f"/api/runs/{run.pk}/checkpoints/1/export/").json()
    request = checkpoint_export_request(Checkpoint.objects.get(pk=started["id"]))
    # The step's files went missing before the export worker got to them.
    broken = request.model_copy(update={"run_directory": str(Path(request.run_directory) / "gone")})
    report = run_export(broken)
    assert report.status == "failed" and report.error, report
    assert record_checkpoint_export(report.model_dump(mode="json")) == "failed"
    detail = api.get(f"/api/runs/{run.pk}/checkpoints/1/").json()
    assert (detail["export_status"], detail["export_error"]) == ("failed", report.error)
    assert api.post(f"/api/runs/{run.pk}/checkpoints/1/export/").status_code == 202


def test_an_export_report_naming_another_destination_is_recorded_as_failed(api, trainer_api, run, checkpointer,
                                                                          tmp_path):
    save_checkpoints(checkpointer, RunConfig.model_validate(run.config), range(1, 2))
    _report(trainer_api, run, checkpointer)
    started = api.post(f"/api/runs/{run.pk}/checkpoints/1/export/").json()
    request = checkpoint_export_request(Checkpoint.objects.get(pk=started["id"]))
    elsewhere = run_export(request.model_copy(update={"destination": str(tmp_path / "elsewhere")}))
    assert elsewhere.status == "exported", elsewhere.error
    assert record_checkpoint_export(elsewhere.model_dump(mode="json")) == "failed"
    checkpoint = Checkpoint.objects.get(pk=started["id"])
    assert checkpoint.export_path == "" and "elsewhere" in checkpoint.export_error
    assert api.get(f"/api/runs/{run.pk}/checkpoints/1/download/").status_code == 404


def test_an_export_reported_after_its_checkpoint_was_deleted_leaves_it_deleted(api, trainer_api, run, checkpointer):
    save_checkpoints(checkpointer, RunConfig.model_validate(run.config), range(1, 3))
    _report(trainer_api, run, checkpointer)
    started = api.post(f"/api/runs/{run.pk}/checkpoints/1/export/").json()
    request = checkpoint_export_request(Checkpoint.objects.get(pk=started["id"]))
    report = run_export(request)
    assert api.delete(f"/api/runs/{run.pk}/checkpoints/1/").status_code == 200
    assert record_checkpoint_export(report.model_dump(mode="json")) == "exporting"
    assert Checkpoint.objects.get(pk=started["id"]).status == "deleted"


def test_an_export_no_worker_reports_fails_after_its_time_limit_and_a_queue_wait(api, trainer_api, run,
                                                                                checkpointer):
    from datetime import timedelta

    from checkpoints.services import checkpoint_exports_expire
    from tandem.contracts import CHECKPOINT_EXPORT_QUEUED_S, CHECKPOINT_EXPORT_TIME_LIMIT_S

    save_checkpoints(checkpointer, RunConfig.model_validate(run.config), range(1, 2))
    _report(trainer_api, run, checkpointer)
    started = api.post(f"/api/runs/{run.pk}/checkpoints/1/export/").json()
    requested_at = Checkpoint.objects.get(pk=started["id"]).export_requested_at
    waited = timedelta(seconds=CHECKPOINT_EXPORT_TIME_LIMIT_S + CHECKPOINT_EXPORT_QUEUED_S)
    assert checkpoint_exports_expire(now=requested_at + waited - timedelta(seconds=1)) == 0
    assert Checkpoint.objects.get(pk=started["id"]).export_status == "exporting"

    assert checkpoint_exports_expire(now=requested_at + waited + timedelta(seconds=1)) == 1
    detail = api.get(f"/api/runs/{run.pk}/checkpoints/1/").json()
    assert detail["export_status"] == "failed" and "'exports' queue" in detail["export_error"]
    # A report that comes after all changes nothing; the user may export again.
    late = run_export(checkpoint_export_request(Checkpoint.objects.get(pk=started["id"])))
    assert record_checkpoint_export(late.model_dump(mode="json")) == "failed"
    assert api.post(f"/api/runs/{run.pk}/checkpoints/1/export/").status_code == 202


def test_a_late_report_of_an_expired_export_is_not_taken_for_the_export_asked_for_since(api, trainer_api, run,
                                                                                       checkpointer):
    """Before, a report named only its checkpoint: the first export's, arriving after it expired and the user
    asked again, was recorded as the second one's outcome."""
    from datetime import timedelta

    from checkpoints.services import checkpoint_exports_expire
    from tandem.contracts import CHECKPOINT_EXPORT_QUEUED_S, CHECKPOINT_EXPORT_TIME_LIMIT_S

    save_checkpoints(checkpointer, RunConfig.model_validate(run.config), range(1, 2))
    _report(trainer_api, run, checkpointer)
    started = api.post(f"/api/runs/{run.pk}/checkpoints/1/export/").json()
    first = checkpoint_export_request(Checkpoint.objects.get(pk=started["id"]))
    waited = timedelta(seconds=CHECKPOINT_EXPORT_TIME_LIMIT_S + CHECKPOINT_EXPORT_QUEUED_S + 1)
    assert checkpoint_exports_expire(now=Checkpoint.objects.get(pk=started["id"]).export_requested_at + waited) == 1
    assert api.post(f"/api/runs/{run.pk}/checkpoints/1/export/").status_code == 202
    second = checkpoint_export_request(Checkpoint.objects.get(pk=started["id"]))
    assert second.requested_at > first.requested_at

    # The first request's export fails late (its step's files were gone): the second is still under way.
    late = run_export(first.model_copy(update={"run_directory": str(Path(first.run_directory) / "gone")}))
    assert late.status == "failed" and late.requested_at == first.requested_at
    assert record_checkpoint_export(late.model_dump(mode="json")) == "exporting"
    report = run_export(second)
    assert report.status == "exported", report.error
    assert record_checkpoint_export(report.model_dump(mode="json")) == "exported"


def test_delete_removes_the_files_but_never_the_newest_of_an_active_run(api, trainer_api, run, checkpointer):
    save_checkpoints(checkpointer, RunConfig.model_validate(run.config), range(1, 3))
    _report(trainer_api, run, checkpointer)

    refused = api.delete(f"/api/runs/{run.pk}/checkpoints/2/")
    assert refused.status_code == 409 and "resum" in refused.json()["error"]["message"]
    assert checkpointer.step_directory(2).is_dir()

    deleted = api.delete(f"/api/runs/{run.pk}/checkpoints/1/")
    assert deleted.status_code == 200, deleted.json()
    assert (deleted.json()["status"], deleted.json()["deleted_reason"]) == ("deleted", "deleted by alice")
    assert not checkpointer.step_directory(1).exists()
    assert api.delete(f"/api/runs/{run.pk}/checkpoints/1/").status_code == 409
    assert api.post(f"/api/runs/{run.pk}/checkpoints/1/export/").status_code == 409
    # The trainer no longer lists it, and a later report keeps the user's reason.
    assert [c["step"] for c in _report(trainer_api, run, checkpointer)] == [2]
    assert Checkpoint.objects.get(run=run, step=1).deleted_reason == "deleted by alice"


def test_the_newest_checkpoint_of_a_finished_run_can_be_deleted(api, trainer_api, run, checkpointer):
    save_checkpoints(checkpointer, RunConfig.model_validate(run.config), range(1, 2))
    _report(trainer_api, run, checkpointer)
    run_heartbeat(run=run, heartbeat=TrainerHeartbeat(status="finished", worker="trainer-host:1"))
    assert api.delete(f"/api/runs/{run.pk}/checkpoints/1/").status_code == 200


def test_viewers_read_but_cannot_export_or_delete(client_for, make_user, project, trainer_api, run, checkpointer):
    from accounts.services import membership_add

    viewer = make_user()
    membership_add(project=project, user=viewer, role="viewer")
    save_checkpoints(checkpointer, RunConfig.model_validate(run.config), range(1, 3))
    _report(trainer_api, run, checkpointer)
    client = client_for(viewer)
    assert [c["step"] for c in client.get(f"/api/runs/{run.pk}/checkpoints/").json()["results"]] == [2, 1]
    assert client.post(f"/api/runs/{run.pk}/checkpoints/1/export/").status_code == 403
    assert client.delete(f"/api/runs/{run.pk}/checkpoints/1/").status_code == 403
    assert checkpointer.step_directory(1).is_dir()
    assert Checkpoint.objects.get(run=run, step=1).export_status == "none"


def test_another_projects_user_gets_404(client_for, make_user, trainer_api, run, checkpointer):
    save_checkpoints(checkpointer, RunConfig.model_validate(run.config), range(1, 2))
    _report(trainer_api, run, checkpointer)
    outsider = client_for(make_user())
    for method, path in [("get", ""), ("get", "1/"), ("post", "1/export/"), ("get", "1/download/"), ("delete", "1/")]:
        assert getattr(outsider, method)(f"/api/runs/{run.pk}/checkpoints/{path}").status_code == 404, path
    assert checkpointer.step_directory(1).is_dir()


@pytest.mark.parametrize("count", [1, 12])
def test_the_list_takes_a_fixed_number_of_queries(api, trainer_api, run, count, django_assert_num_queries,
                                                   checkpoint_root):
    body = {"checkpoints": [{"step": step, "policy_version": step,
                             "path": str(checkpoint_root / f"run-{run.pk}" / str(step)),
                             "size_bytes": 100} for step in range(1, count + 1)]}
    assert trainer_api.post(f"/api/trainer/runs/{run.pk}/checkpoints/", body, format="json").status_code == 200
    api.get("/api/projects/")  # records the token's last use, a write that happens once a minute
    # Authentication, the run with its project check, then the page's count and rows.
    with django_assert_num_queries(4):
        response = api.get(f"/api/runs/{run.pk}/checkpoints/")
    assert len(response.json()["results"]) == count


def test_the_checkpoints_section_points_its_script_at_the_runs_list(run):
    from django.template.loader import render_to_string
    from django.test import RequestFactory

    request = RequestFactory().get(f"/runs/{run.pk}/")
    html = render_to_string("runs/_checkpoints.html", {"run": run, "can_write": False}, request=request)
    assert f'data-list-url="/api/runs/{run.pk}/checkpoints/"' in html
    assert 'data-can-write="false"' in html and "tandem/run_checkpoints.js" in html
    assert "The newest 2 stay on disk" in html
