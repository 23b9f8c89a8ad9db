"""Datasets under hostile input (issue 28, findings 2, 3, 7 and 17): unstorable characters are a 400
naming the line and field, checking stops at the errors it shows, rows are stored in batches after the
upload is answered, one upload per user at a time, token counts are computed once and stored, a
project's quota, and deleting a version."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from common.domain_errors import InvalidInput
from dataset_registry.models import Dataset, DatasetRow, DatasetTokenStats, DatasetVersion
from dataset_registry.services import READ_CHUNK_BYTES, ROW_ERRORS_SHOWN, dataset_upload
from runs.services import run_cancel

from .test_datasets_api import conversation, dataset_media_root, jsonl, store_accepted, upload  # noqa: F401

pytestmark = pytest.mark.django_db

_ROW = '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": %s}]%s}'


@pytest.mark.parametrize(("line", "field"), [
    (_ROW % ('"ok"', ', "metadata": {"note": "x\\ud800y"}'), "metadata.note"),
    (_ROW % ('"x\\udfffy"', ""), "messages.1.content"),
    (_ROW % ('"ok"', ', "metadata": {"note": "a\\u0000b"}'), "metadata.note"),
    (_ROW % ('"ok"', ', "metadata": {"score": NaN}'), "metadata.score"),
    (_ROW % ('"ok"', ', "metadata": {"score": 1e400}'), "metadata.score"),
    (_ROW % ('"ok"', ', "metadata": {"deep": ' + "[" * 40 + "]" * 40 + "}"), "metadata.deep.0.0"),
    ('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": '
     '[{"name": "calc\\u0000", "arguments": {}}]}]}', "messages.1.tool_calls.0.name"),
])
def test_an_unstorable_value_in_a_row_is_a_400_naming_its_line_and_field(api, project, line, field):
    response = upload(api, project, "hostile", jsonl(conversation(), line))

    assert response.status_code == 400, response.content
    [error] = response.json()["error"]["fields"]["file"]
    assert error.startswith(f"line 2: {field}"), error
    assert not Dataset.objects.filter(name="hostile").exists()


def test_an_invalid_utf8_byte_inside_a_string_is_named_by_its_field(api, project):
    content = jsonl(conversation()) + _ROW.encode() % (b'"caf\xe9"', b"") + b"\n"
    response = upload(api, project, "latin1", content)

    assert response.status_code == 400
    assert response.json()["error"]["fields"]["file"][0].startswith("line 2: messages.1.content: is not valid UTF-8")


def test_checking_a_file_of_bad_lines_stops_at_the_errors_it_shows(project, tmp_path):
    # 8 MiB of bad lines, as the finding uploaded: the check reads no further than its 20th.
    path = tmp_path / "bad.jsonl"
    bad_line = b'{"messages": "not a list", "metadata": {"padding": "' + b"x" * 200 + b'"}}\n'
    path.write_bytes(bad_line * (8 * 2**20 // len(bad_line)))
    with path.open("rb") as file, pytest.raises(InvalidInput) as refused:
        dataset_upload(user=project.owner, project=project, name="bad", file=file, file_name="bad.jsonl")
    errors = refused.value.fields["file"]
    assert len(errors) == ROW_ERRORS_SHOWN and errors[-1].startswith(f"line {ROW_ERRORS_SHOWN}: messages")
    assert "checking stopped" in refused.value.message
    assert not Dataset.objects.exists()


def test_checking_stops_reading_the_file_at_the_errors_it_shows(project, tmp_path):
    path = tmp_path / "bad.jsonl"
    bad_line = b'{"messages": "not a list"}\n'
    path.write_bytes(bad_line * (8 * 2**20 // len(bad_line)))
    file = path.open("rb")
    try:
        with pytest.raises(InvalidInput):
            dataset_upload(user=project.owner, project=project, name="bad", file=file, file_name="bad.jsonl")
        assert file.tell() <= READ_CHUNK_BYTES, f"the check read {file.tell()} bytes of a file of bad lines"
    finally:
        file.close()


def test_an_upload_is_answered_before_its_rows_are_stored_in_batches(api, project):
    response = upload(api, project, "big", jsonl(*[conversation(f"{n}?", str(n)) for n in range(2500)]), store=False)

    assert response.status_code == 202, response.content
    version = DatasetVersion.objects.get(dataset__name="big")
    assert (version.status, version.row_count, version.rows_stored) == ("pending", 2500, 0)
    assert not DatasetRow.objects.exists()
    with CaptureQueriesContext(connection) as queries:
        store_accepted(response)
    inserts = [query["sql"] for query in queries.captured_queries if query["sql"].startswith('INSERT INTO "datasets_datasetrow"')]
    savepoints = [query["sql"] for query in queries.captured_queries if query["sql"].startswith("SAVEPOINT")]
    # Three transactions of at most 1,000 rows (savepoints inside the test's own transaction).
    assert len(inserts) == 3 and len(savepoints) >= 3
    version.refresh_from_db()
    assert (version.status, version.rows_stored, version.kept_file) == ("ready", 2500, "")
    assert DatasetRow.objects.filter(version=version).count() == 2500


def test_a_second_upload_while_the_first_is_stored_is_a_409_naming_it(api, client_for, make_user, project):
    first = upload(api, project, "first", jsonl(conversation()), store=False)
    assert first.status_code == 202

    second = upload(api, project, "second", jsonl(conversation()))
    assert second.status_code == 409, second.content
    assert "You have an upload in progress: first@1 is pending" in second.json()["error"]["message"]
    assert not Dataset.objects.filter(name="second").exists()
    # Another member uploads meanwhile; once the first is stored, so can its user.
    colleague = make_user()
    from accounts.models import Membership
    from accounts.services import membership_add
    membership_add(project=project, user=colleague, role=Membership.Role.MEMBER)
    assert upload(client_for(colleague), project, "theirs", jsonl(conversation())).status_code == 202
    store_accepted(first)
    assert upload(api, project, "second", jsonl(conversation())).status_code == 202


def test_a_run_on_a_version_not_yet_stored_is_a_400_naming_the_dataset(api, project, environment):
    upload(api, project, "support", jsonl(conversation()), store=False)
    response = api.post("/api/runs/", {"project": project.pk, "environment": "calculator", "config": {
        "sft_steps": 2, "rl_steps": 1, "sft": {"datasets": [{"name": "support"}]}}}, format="json")

    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["config.sft.datasets.0.name"]
    assert "support@1 is still being stored (pending: 0 of 1 rows)" in response.json()["error"]["message"]
    rows = api.get(f"/api/datasets/{Dataset.objects.get().pk}/versions/1/rows/")
    assert rows.status_code == 409


def test_the_dataset_page_shows_stored_token_counts_and_computing_until_they_are(user, api, project):
    upload(api, project, "chats", jsonl(conversation("2+2?", "four")))
    dataset = Dataset.objects.get(name="chats")
    browser = Client()
    browser.force_login(user)

    for _ in range(3):
        page = browser.get(f"/datasets/{dataset.pk}/").content.decode()
        assert "Computing: the datasets worker counts the tokens once" in page
    stats = DatasetTokenStats.objects.get()  # asked for once, however often the page is seen
    assert (stats.tokenizer, stats.status) == ("byte", "computing")

    from dataset_registry.services import version_token_stats_compute
    version_token_stats_compute(stats_id=stats.pk)
    page = browser.get(f"/datasets/{dataset.pk}/").content.decode()
    assert '<dd id="tokens-total">17</dd>' in page  # bytes: "Be brief." 9, "2+2?" 4, "four" 4
    assert '<dd id="tokens-assistant">4</dd>' in page


def test_a_project_past_its_dataset_quota_is_a_400_naming_the_setting(api, project, settings):
    settings.TANDEM_DATASET_PROJECT_MAX_VERSIONS = 2
    assert upload(api, project, "a", jsonl(conversation())).status_code == 202
    assert upload(api, project, "a", jsonl(conversation())).status_code == 202
    refused = upload(api, project, "b", jsonl(conversation()))
    assert refused.status_code == 400
    assert list(refused.json()["error"]["fields"]) == ["name"]
    assert "TANDEM_DATASET_PROJECT_MAX_VERSIONS" in refused.json()["error"]["message"]

    settings.TANDEM_DATASET_PROJECT_MAX_VERSIONS = 100
    used = sum(DatasetVersion.objects.values_list("size_bytes", flat=True))
    settings.TANDEM_DATASET_PROJECT_MAX_BYTES = used + 10
    refused = upload(api, project, "b", jsonl(conversation()))
    assert refused.status_code == 400 and list(refused.json()["error"]["fields"]) == ["file"]
    assert "TANDEM_DATASET_PROJECT_MAX_BYTES" in refused.json()["error"]["message"]
    assert not Dataset.objects.filter(name="b").exists()


def test_a_version_is_deleted_with_its_rows_unless_a_run_not_ended_uses_it(
        api, client_for, make_user, project, environment):
    upload(api, project, "support", jsonl(conversation()))
    upload(api, project, "support", jsonl(conversation(), conversation()))
    dataset = Dataset.objects.get(name="support")
    run = api.post("/api/runs/", {"project": project.pk, "environment": "calculator", "config": {
        "sft_steps": 2, "rl_steps": 1, "sft": {"datasets": [{"name": "support", "version": 1}]}}}, format="json")
    assert run.status_code == 201, run.json()
    base = f"/api/datasets/{dataset.pk}/versions"

    refused = api.delete(f"{base}/1/")
    assert refused.status_code == 409
    assert f"support@1 is used by run {run.json()['id']} (queued, not ended)" in refused.json()["error"]["message"]
    viewer = make_user()
    from accounts.models import Membership
    from accounts.services import membership_add
    membership_add(project=project, user=viewer, role=Membership.Role.VIEWER)
    assert client_for(viewer).delete(f"{base}/2/").status_code == 403

    assert api.delete(f"{base}/2/").status_code == 204
    assert list(dataset.versions.values_list("number", flat=True)) == [1]
    assert DatasetRow.objects.filter(version__number=2).count() == 0
    from runs.models import Run
    run_cancel(user=project.owner, run=Run.objects.get(pk=run.json()["id"]))
    assert api.delete(f"{base}/1/").status_code == 204
    assert not Dataset.objects.filter(pk=dataset.pk).exists() and not DatasetRow.objects.exists()


def test_the_dataset_page_deletes_a_version_and_says_why_it_cannot(user, api, project, environment):
    upload(api, project, "support", jsonl(conversation()))
    upload(api, project, "support", jsonl(conversation()))
    dataset = Dataset.objects.get(name="support")
    assert api.post("/api/runs/", {"project": project.pk, "environment": "calculator", "config": {
        "sft_steps": 2, "rl_steps": 1, "sft": {"datasets": [{"name": "support", "version": 1}]}}},
        format="json").status_code == 201
    browser = Client()
    browser.force_login(user)
    page = browser.get(f"/datasets/{dataset.pk}/?version=2").content.decode()
    assert f'action="/datasets/{dataset.pk}/versions/2/delete/"' in page

    deleted = browser.post(f"/datasets/{dataset.pk}/versions/2/delete/", follow=True)
    assert "Deleted support@2." in deleted.content.decode()
    refused = browser.post(f"/datasets/{dataset.pk}/versions/1/delete/", follow=True).content.decode()
    assert "support@1 is used by run " in refused and "not ended" in refused
    assert list(dataset.versions.values_list("number", flat=True)) == [1]


def test_an_uploaded_row_holding_a_lone_surrogate_never_reaches_a_page(user, api, project):
    # Finding 2's row, as the finding sent it (201, then its page and rows API answered 500 for good).
    line = json.dumps({**conversation(), "metadata": {"note": "x\ud800y"}})
    response = upload(api, project, "surrogate", jsonl(conversation(), line))
    browser = Client()
    browser.force_login(user)
    for dataset in Dataset.objects.filter(name="surrogate"):
        assert browser.get(f"/datasets/{dataset.pk}/").status_code == 200
        assert api.get(f"/api/datasets/{dataset.pk}/versions/1/rows/").status_code == 200
    assert response.status_code == 400
    assert response.json()["error"]["fields"]["file"] == [
        "line 2: metadata.note: is not valid UTF-8: a lone surrogate or an invalid byte (\\ud800)"]


@pytest.mark.parametrize("filename", [b"a\x00b.jsonl", b"caf\xe9.jsonl", b"\xed\xa0\x80.jsonl"])
def test_a_file_name_of_nul_or_invalid_utf8_never_breaks_the_upload(api, user, project, filename):
    from .test_datasets_fuzz import BOUNDARY, _multipart

    body = _multipart({"project": str(project.pk).encode(), "name": b"named"}, jsonl(conversation()), filename)
    response = store_accepted(api.post("/api/datasets/", data=body,
                                       content_type=f"multipart/form-data; boundary={BOUNDARY}"))
    assert response.status_code in (202, 400), response.content
    if response.status_code == 202:
        source_name = DatasetVersion.objects.get(dataset__name="named").source_name
        assert "\x00" not in source_name and source_name.encode("utf-8")
        browser = Client()
        browser.force_login(user)
        assert browser.get(f"/datasets/{response.json()['id']}/").status_code == 200
