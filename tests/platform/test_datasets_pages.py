"""The dashboard's dataset pages (upload, rows, token statistics) and the run page's SFT data."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from dataset_registry.models import Dataset, DatasetVersion
from dataset_registry.services import dataset_version_store, version_token_stats_compute
from tests.platform.builders import step_event

from .test_datasets_api import _held_run_on, conversation, dataset_media_root, jsonl, upload  # noqa: F401

pytestmark = pytest.mark.django_db


@pytest.fixture
def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_upload_form_registers_a_version_and_its_page_shows_rows_and_tokens(browser, project):
    file = SimpleUploadedFile("chats.jsonl", jsonl(conversation("2+2?", "four"), conversation("é?", "é")))
    response = browser.post("/datasets/", {"project": project.pk, "name": "chats", "file": file})
    dataset = Dataset.objects.get(name="chats")
    assert response.status_code == 302 and response.url == f"/datasets/{dataset.pk}/"
    page = browser.get(response.url).content.decode()
    assert "Waiting for the datasets worker: 0 of 2 rows stored so far" in page

    # What the datasets worker does next, by its services: the rows, then the byte counts.
    version = dataset.versions.get()
    dataset_version_store(version_id=version.pk)
    version_token_stats_compute(stats_id=version.token_stats.get(tokenizer="byte").pk)
    page = browser.get(response.url).content.decode()
    assert '<dd id="row-count">2</dd>' in page
    # Byte tokens of the messages' text: "Be brief." 9, "2+2?" 4, "four" 4; "é?" 3 and "é" 2 bytes.
    assert '<dd id="tokens-total">31</dd>' in page
    assert '<dd id="tokens-assistant">6</dd>' in page
    assert "2+2?" in page and "four" in page
    assert "Datasets" in browser.get("/datasets/").content.decode()


def test_a_version_the_worker_could_not_store_says_so_in_red_with_its_reason(browser, project):
    file = SimpleUploadedFile("chats.jsonl", jsonl(conversation("2+2?", "four")))
    response = browser.post("/datasets/", {"project": project.pk, "name": "broken", "file": file})
    version = Dataset.objects.get(name="broken").versions.get()
    version.status, version.failure_reason = DatasetVersion.Status.FAILED, "the stored file is gone"
    version.save(update_fields=["status", "failure_reason"])

    page = browser.get(response.url).content.decode()

    assert '<p id="version-status" class="error">' in page and ": the stored file is gone" in page


def test_a_bad_file_is_shown_on_the_form_by_line_and_stores_nothing(browser, project):
    file = SimpleUploadedFile("bad.jsonl", jsonl(conversation(), {"messages": [{"role": "user", "content": "x"}]}))
    page = browser.post("/datasets/", {"project": project.pk, "name": "bad", "file": file}).content.decode()
    assert "line 2: messages:" in page
    assert not Dataset.objects.filter(name="bad").exists()


def test_the_run_page_shows_the_datasets_the_sft_phase_used_with_steps_and_tokens(
        api, trainer_api, browser, project, environment):
    upload(api, project, "support", jsonl(conversation()))
    run = _held_run_on(api, project, {"sft_steps": 2, "rl_steps": 1, "sft": {"datasets": [{"name": "support"}]}})
    events = [step_event(run.pk, step, phase="sft", algorithm_metrics={"sft/rows/0": 4.0, "sft/tokens": 100.0})
              for step in (1, 2)]
    posted = trainer_api.post(f"/api/trainer/runs/{run.pk}/telemetry/", {"events": events}, format="json")
    assert posted.status_code == 202, posted.content

    page = browser.get(f"/runs/{run.pk}/").content.decode()
    assert '<span id="sft-steps">2</span> of 2 SFT steps' in page
    assert '<span id="sft-tokens">200</span> tokens' in page
    dataset = Dataset.objects.get(name="support")
    assert f'href="/datasets/{dataset.pk}/?version=1">support@1</a>' in page
    assert "<td>8</td>" in page
