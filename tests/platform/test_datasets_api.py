"""SFT datasets over the API: validated uploads, immutable versions, path roots, the size cap, runs that pin them."""

from __future__ import annotations

import io
import json

import pytest

from dataset_registry.models import Dataset, DatasetRow, DatasetVersion
from dataset_registry.services import dataset_version_store
from environment_registry.services import environment_register
from runs.services import run_claim_next, run_heartbeat
from tandem.contracts import EnvironmentSpec, TrainerHeartbeat
from tests.platform.conftest import TRAINER_NAME

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def dataset_media_root(settings, tmp_path):
    """Kept upload files go under the test's own directory."""
    settings.MEDIA_ROOT = tmp_path / "media"
    return settings.MEDIA_ROOT


def conversation(question: str = "2+2?", answer: str = "4", **extra) -> dict:
    return {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": question},
                         {"role": "assistant", "content": answer}], **extra}


def jsonl(*rows) -> bytes:
    return "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows).encode()


def store_accepted(response):
    """What the datasets worker does with an accepted upload, done here by its service (the test's
    transaction is one the worker could not see): its rows stored."""
    if response.status_code == 202:
        dataset_version_store(version_id=response.json()["latest_version"]["id"])
    return response


def upload(api, project, name: str, content: bytes, *, filename: str = "rows.jsonl", store: bool = True):
    file = io.BytesIO(content)
    file.name = filename
    response = api.post("/api/datasets/", {"project": project.pk, "name": name, "file": file}, format="multipart")
    return store_accepted(response) if store else response


def test_an_upload_is_version_1_with_its_rows_and_the_next_upload_is_version_2(api, project):
    first = upload(api, project, "support", jsonl(conversation(), conversation("3+3?", "6")))
    assert first.status_code == 202, first.json()
    assert first.json()["latest_version"]["status"] == "pending"
    body = first.json()
    assert (body["name"], body["latest_version"]["number"], body["latest_version"]["row_count"]) == ("support", 1, 2)
    assert body["latest_version"]["role_counts"] == {"assistant": 2, "system": 2, "user": 2}

    second = upload(api, project, "support", jsonl(conversation("1+1?", "2")))
    assert second.status_code == 202
    assert [version["number"] for version in second.json()["versions"]] == [2, 1]
    # Version 1 is as it was: a new upload never changes an old version.
    version_1 = DatasetVersion.objects.get(dataset__name="support", number=1)
    assert version_1.row_count == 2
    rows = api.get(f"/api/datasets/{body['id']}/versions/1/rows/").json()
    assert [row["messages"][1]["content"] for row in rows["rows"]] == ["2+2?", "3+3?"]


def test_tool_calls_in_openai_shape_are_stored_as_name_and_arguments(api, project):
    row = {"messages": [
        {"role": "user", "content": "What is 37*58?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "calc", "arguments": "{\"expression\": \"37*58\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "calc", "content": "2146"},
        {"role": "assistant", "content": "2146"}]}
    assert upload(api, project, "calls", jsonl(row)).status_code == 202
    stored = DatasetRow.objects.get(version__dataset__name="calls").messages
    assert stored[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"name": "calc", "arguments": {"expression": "37*58"}}]}
    assert stored[2]["tool_call_id"] == "c1"


def test_every_bad_row_is_named_by_line_and_field_and_nothing_is_stored(api, project):
    content = jsonl(
        conversation(),
        {"messages": [{"role": "user", "content": "hi"}, {"role": "robot", "content": "beep"}]},
        "{not json",
        conversation(),
        {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant"}]},
    )
    response = upload(api, project, "broken", content)

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["message"].startswith("file: line 2: messages.1.role: Input should be")
    assert "nothing was stored" in error["message"]
    assert [message.split(":")[0] for message in error["fields"]["file"]] == ["line 2", "line 3", "line 5"]
    assert error["fields"]["file"][2].startswith("line 5: messages.1: content is required")
    assert not Dataset.objects.filter(name="broken").exists()
    assert not DatasetRow.objects.exists()


def test_a_bad_upload_of_an_existing_name_leaves_its_versions_as_they_were(api, project):
    assert upload(api, project, "support", jsonl(conversation())).status_code == 202
    bad = upload(api, project, "support", jsonl(conversation(), {"messages": []}))
    assert bad.status_code == 400 and bad.json()["error"]["fields"]["file"][0].startswith("line 2: messages:")
    assert list(DatasetVersion.objects.filter(dataset__name="support").values_list("number", flat=True)) == [1]


def test_a_conversation_without_an_assistant_message_or_starting_with_one_is_refused(api, project):
    no_answer = {"messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": "hello?"}]}
    answer_first = {"messages": [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "?"}]}
    errors = upload(api, project, "odd", jsonl(no_answer, answer_first)).json()["error"]["fields"]["file"]
    assert "at least one assistant message" in errors[0]
    assert errors[1].startswith("line 2: messages: the first message after any system messages must be a user")


def test_an_upload_larger_than_the_cap_is_a_413_naming_the_cap(api, project, settings):
    settings.TANDEM_DATASET_MAX_BYTES = 300
    response = upload(api, project, "big", jsonl(*[conversation()] * 20))
    assert response.status_code == 413
    assert "TANDEM_DATASET_MAX_BYTES" in response.json()["error"]["message"]
    assert "300 bytes" in response.json()["error"]["message"]
    assert not Dataset.objects.exists()
    assert upload(api, project, "small", jsonl(conversation())).status_code == 202


def test_a_path_is_read_only_under_the_dataset_roots(api, project, settings, tmp_path):
    root, outside = tmp_path / "datasets", tmp_path / "elsewhere"
    root.mkdir(), outside.mkdir()
    (root / "ok.jsonl").write_bytes(jsonl(conversation()))
    (outside / "secret.jsonl").write_bytes(jsonl(conversation()))
    (root / "escape.jsonl").symlink_to(outside / "secret.jsonl")
    settings.TANDEM_DATASET_ROOTS = (root,)

    ok = store_accepted(api.post("/api/datasets/", {"project": project.pk, "name": "from-path",
                                                    "path": str(root / "ok.jsonl")}, format="json"))
    assert ok.status_code == 202, ok.json()
    assert ok.json()["latest_version"]["source"] == "path"
    for path in (outside / "secret.jsonl", root / "escape.jsonl", f"{root}/../elsewhere/secret.jsonl"):
        refused = api.post("/api/datasets/", {"project": project.pk, "name": "from-path", "path": str(path)},
                           format="json")
        assert refused.status_code == 400, path
        assert list(refused.json()["error"]["fields"]) == ["path"]
    message = api.post("/api/datasets/", {"project": project.pk, "name": "x", "path": str(outside / "secret.jsonl")},
                       format="json").json()["error"]["message"]
    assert "TANDEM_DATASET_ROOTS" in message
    assert DatasetVersion.objects.filter(dataset__name="from-path").count() == 1


def test_another_projects_datasets_are_not_found(api, client_for, make_user, make_project, project):
    upload(api, project, "mine", jsonl(conversation()))
    stranger = make_user()
    make_project(owner=stranger)
    dataset = Dataset.objects.get(name="mine")
    assert client_for(stranger).get(f"/api/datasets/{dataset.pk}/").status_code == 404
    assert client_for(stranger).get("/api/datasets/").json()["results"] == []


# -- runs that SFT on datasets ----------------------------------------------------------------

def _register_plain_environment(project, name="plain"):
    spec = EnvironmentSpec(name=name, kind="python", entrypoint="tests.workers.maze:MazeEnvironment")
    return environment_register(user=project.owner, project=project, spec=spec).environment


def test_a_run_pins_the_latest_version_of_each_dataset_it_names(api, project, environment):
    upload(api, project, "support", jsonl(conversation()))
    upload(api, project, "support", jsonl(conversation("5+5?", "10")))
    response = api.post("/api/runs/", {"project": project.pk, "environment": "calculator", "config": {
        "sft_steps": 2, "rl_steps": 1, "sft": {"datasets": [{"name": "support", "weight": 2}]}}}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["config"]["sft"]["datasets"] == [{"name": "support", "version": 2, "weight": 2.0}]
    # A third upload later changes nothing of the run's data.
    upload(api, project, "support", jsonl(conversation()))
    run = api.get(f"/api/runs/{response.json()['id']}/").json()
    assert run["config"]["sft"]["datasets"][0]["version"] == 2


def test_a_run_naming_an_unknown_dataset_or_version_is_a_400_naming_the_field(api, project, environment):
    upload(api, project, "support", jsonl(conversation()))
    for entry, field in (({"name": "nope"}, "config.sft.datasets.0.name"),
                         ({"name": "support", "version": 7}, "config.sft.datasets.0.version")):
        response = api.post("/api/runs/", {"project": project.pk, "environment": "calculator", "config": {
            "sft_steps": 2, "sft": {"datasets": [entry]}}}, format="json")
        assert response.status_code == 400
        assert list(response.json()["error"]["fields"]) == [field]


def test_sft_without_any_data_is_a_400_naming_sft_steps(api, project):
    _register_plain_environment(project)
    response = api.post("/api/runs/", {"project": project.pk, "environment": "plain",
                                       "config": {"sft_steps": 5}}, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert list(error["fields"]) == ["config.sft_steps"]
    assert "plain@1 is not known to have demonstrations" in error["message"]
    # No SFT asked: fine. A dataset given: fine too.
    assert api.post("/api/runs/", {"project": project.pk, "environment": "plain",
                                   "config": {"sft_steps": 0}}, format="json").status_code == 201
    upload(api, project, "support", jsonl(conversation()))
    with_data = api.post("/api/runs/", {"project": project.pk, "environment": "plain", "config": {
        "sft_steps": 5, "sft": {"datasets": [{"name": "support"}]}}}, format="json")
    assert with_data.status_code == 201, with_data.json()


def test_builtin_environments_declare_their_demonstrations(api, project, environment):
    response = api.post("/api/runs/", {"project": project.pk, "environment": "calculator",
                                       "config": {"sft_steps": 5}}, format="json")
    assert response.status_code == 201
    zero = api.post("/api/runs/", {"project": project.pk, "environment": "calculator",
                                   "config": {"sft_steps": 5, "sft": {"demonstrations_weight": 0}}}, format="json")
    assert zero.status_code == 400 and list(zero.json()["error"]["fields"]) == ["config.sft_steps"]


# -- the trainer's rows ----------------------------------------------------------------------

def _held_run_on(api, project, config):
    response = api.post("/api/runs/", {"project": project.pk, "environment": "calculator", "config": config},
                        format="json")
    assert response.status_code == 201, response.json()
    claimed = run_claim_next(worker=TRAINER_NAME)
    run_heartbeat(run=claimed, heartbeat=TrainerHeartbeat(worker=TRAINER_NAME))
    return claimed


def test_the_trainer_reads_the_rows_its_run_pins_page_by_page(api, trainer_api, project, environment):
    upload(api, project, "support", jsonl(*[conversation(f"{n}+0?", str(n)) for n in range(5)]))
    upload(api, project, "other", jsonl(conversation()))
    run = _held_run_on(api, project, {"sft_steps": 2, "rl_steps": 1, "sft": {"datasets": [{"name": "support"}]}})
    base = f"/api/trainer/runs/{run.pk}/datasets"

    page = trainer_api.get(f"{base}/support/versions/1/rows/", {"offset": 3, "limit": 10}).json()
    assert (page["total"], page["offset"], len(page["rows"])) == (5, 3, 2)
    assert page["rows"][0]["messages"][1]["content"] == "3+0?"
    # Only what the run's config pins, and only for the trainer holding it.
    assert trainer_api.get(f"{base}/other/versions/1/rows/").status_code == 404
    assert trainer_api.get(f"{base}/support/versions/2/rows/").status_code == 404
    assert api.get(f"{base}/support/versions/1/rows/").status_code == 403
    trainer_api.credentials(HTTP_AUTHORIZATION=trainer_api._credentials["HTTP_AUTHORIZATION"],
                            HTTP_X_TANDEM_TRAINER="another-host:2")
    assert trainer_api.get(f"{base}/support/versions/1/rows/").status_code == 409


def _probe_reports_demonstrations(environment, message: str, status: str = "passed"):
    from environment_registry.services import environment_probe_record
    from tandem.contracts import ProbeCheck, ProbeReport

    probe = environment.versions.get().probes.get()
    checks = (ProbeCheck(name="load", status="passed", message="ok"),
              ProbeCheck(name="demonstrations", status=status, message=message))
    environment_probe_record(report=ProbeReport(probe_id=probe.pk, checks=checks, worker="test:1",
                                                started_at=0.0, finished_at=0.1))


def test_a_class_whose_probe_found_demonstrations_may_sft_without_a_dataset(api, project):
    _probe_reports_demonstrations(_register_plain_environment(project, "demonstrator"),
                                  "4 demonstrations of 4 turns")
    _probe_reports_demonstrations(_register_plain_environment(project, "silent"),
                                  "none: runs of this environment skip the SFT warm-up")

    ok = api.post("/api/runs/", {"project": project.pk, "environment": "demonstrator",
                                 "config": {"sft_steps": 3}}, format="json")
    assert ok.status_code == 201, ok.json()
    refused = api.post("/api/runs/", {"project": project.pk, "environment": "silent",
                                      "config": {"sft_steps": 3}}, format="json")
    assert refused.status_code == 400
    assert "silent@1 has no demonstrations" in refused.json()["error"]["message"]
