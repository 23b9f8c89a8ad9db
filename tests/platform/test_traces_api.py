"""Traces on demand: a user requests one, the trainer learns of it, uploads it, the user downloads it."""

import io
import zipfile

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from accounts.models import Membership
from accounts.services import membership_add
from runs.models import Run
from telemetry.models import Trace

from .builders import step_event


@pytest.fixture(autouse=True)
def media_root(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path / "media"
    return settings.MEDIA_ROOT


def _traces(run_id: int) -> str:
    return f"/api/runs/{run_id}/traces/"


def _upload(run_id: int, trace_id: int) -> str:
    return f"/api/trainer/runs/{run_id}/traces/{trace_id}/"


def _telemetry(run_id: int) -> str:
    return f"/api/trainer/runs/{run_id}/telemetry/"


def _zipped_trace() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("plugins/profile/2026_11_30/host.xplane.pb", b"\x0a\x04xla!")
    return buffer.getvalue()


def test_a_requested_trace_reaches_the_trainer_in_its_telemetry_reply(api, trainer_api, running_run):
    response = api.post(_traces(running_run.pk), {"steps": 3}, format="json")

    assert response.status_code == 201, response.content
    trace = response.json()
    assert (trace["steps"], trace["status"], trace["download_url"]) == (3, "requested", None)
    reply = trainer_api.post(_telemetry(running_run.pk), {"events": [step_event(running_run.pk, 1)]},
                             format="json")
    assert reply.status_code == 202
    assert reply.json()["trace_requests"] == [{"id": trace["id"], "steps": 3}]


def test_the_uploaded_trace_is_stored_with_the_run_and_downloadable(api, trainer_api, running_run,
                                                                     media_root):
    trace_id = api.post(_traces(running_run.pk), {"steps": 2}, format="json").json()["id"]
    content = _zipped_trace()

    response = trainer_api.post(_upload(running_run.pk, trace_id), {
        "first_step": 5, "last_step": 6,
        "file": SimpleUploadedFile("trace.zip", content, content_type="application/zip"),
    }, format="multipart")

    assert response.status_code == 200, response.content
    stored = Trace.objects.get(pk=trace_id)
    assert stored.status == "captured" and (stored.first_step, stored.last_step) == (5, 6)
    assert stored.size_bytes == len(content)
    assert (media_root / stored.file.name).read_bytes() == content
    listed = api.get(_traces(running_run.pk)).json()["results"]
    assert [(t["id"], t["status"]) for t in listed] == [(trace_id, "captured")]
    download = api.get(listed[0]["download_url"])
    assert download.status_code == 200
    assert download["Content-Type"] == "application/zip"
    assert b"".join(download.streaming_content) == content
    # Handed in: the trainer is not asked for it again, nor may it upload it twice.
    reply = trainer_api.post(_telemetry(running_run.pk), {"events": []}, format="json")
    assert reply.json()["trace_requests"] == []
    again = trainer_api.post(_upload(running_run.pk, trace_id), {
        "first_step": 5, "last_step": 6, "file": SimpleUploadedFile("trace.zip", content),
    }, format="multipart")
    assert again.status_code == 409


def test_a_trace_the_trainer_could_not_take_is_marked_failed_with_its_reason(api, trainer_api, running_run):
    trace_id = api.post(_traces(running_run.pk), {"steps": 1}, format="json").json()["id"]

    response = trainer_api.post(_upload(running_run.pk, trace_id),
                                {"first_step": 3, "last_step": 3, "error": "start_trace failed: busy"},
                                format="multipart")

    assert response.status_code == 200, response.content
    assert response.json()["status"] == "failed" and response.json()["download_url"] is None
    assert api.get(f"{_traces(running_run.pk)}{trace_id}/download/").status_code == 404


def test_an_upload_with_neither_file_nor_error_names_the_file_field(api, trainer_api, running_run):
    trace_id = api.post(_traces(running_run.pk), {"steps": 1}, format="json").json()["id"]

    response = trainer_api.post(_upload(running_run.pk, trace_id), {"first_step": 1, "last_step": 1},
                                format="multipart")

    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["file"]


@pytest.mark.parametrize("steps", [0, 101, "many"])
def test_a_trace_request_outside_the_step_limits_names_the_steps_field(api, running_run, steps):
    response = api.post(_traces(running_run.pk), {"steps": steps}, format="json")

    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["steps"]


def test_a_finished_run_cannot_be_traced(api, running_run):
    Run.objects.filter(pk=running_run.pk).update(status="finished")

    response = api.post(_traces(running_run.pk), {"steps": 1}, format="json")

    assert response.status_code == 409
    assert not Trace.objects.exists()


def test_a_viewer_sees_traces_but_may_not_request_one(client_for, make_user, running_run):
    viewer = make_user()
    membership_add(project=running_run.project, user=viewer, role=Membership.Role.VIEWER)
    viewer_api = client_for(viewer)

    assert viewer_api.post(_traces(running_run.pk), {"steps": 1}, format="json").status_code == 403
    assert viewer_api.get(_traces(running_run.pk)).json()["results"] == []


def test_others_runs_traces_are_not_found_and_users_may_not_upload(client_for, make_user, api, running_run):
    stranger = client_for(make_user())
    trace_id = api.post(_traces(running_run.pk), {"steps": 1}, format="json").json()["id"]

    assert stranger.get(_traces(running_run.pk)).status_code == 404
    assert stranger.post(_traces(running_run.pk), {"steps": 1}, format="json").status_code == 404
    assert api.post(_upload(running_run.pk, trace_id), {"first_step": 1, "last_step": 1, "error": "x"},
                    format="multipart").status_code == 403


def test_listing_traces_takes_a_fixed_number_of_queries(api, running_run, django_assert_num_queries):
    for _ in range(3):
        api.post(_traces(running_run.pk), {"steps": 1}, format="json")

    # The token's user, the run (membership checked), the count and the page of traces.
    with django_assert_num_queries(4):
        response = api.get(_traces(running_run.pk))

    assert len(response.json()["results"]) == 3
