"""The datasets worker for real: a Celery worker process on the platform-datasets queue (prefork, as
`tandem platform-worker --queues platform-datasets` runs it) stores an accepted upload's rows and
counts its tokens, while the upload's answer came at once."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from celery import current_app
from django.conf import settings as django_settings
from django.db import connection
from django.test import Client

from config.celery import app as celery_app
from dataset_registry.models import DatasetRow, DatasetTokenStats, DatasetVersion
from tandem.contracts import DATASETS_QUEUE
from tests.platform.conftest import REPO_ROOT

from .test_datasets_api import conversation, jsonl, upload

# How long the test waits for the worker: a bound for a stuck worker, not a measure of speed.
WORKER_DEADLINE_S = 120


@pytest.fixture
def datasets_worker(transactional_db, tmp_path, redis_client, settings):
    """A real worker process of the datasets queue, on the test database and this test's media root."""
    redis_client.delete(DATASETS_QUEUE)  # nothing queued by an earlier session
    media = tmp_path / "media"
    settings.MEDIA_ROOT = media
    db = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "TANDEM_MEDIA_ROOT": str(media),
        "PYTHONPATH": str(REPO_ROOT),
    }
    log = tmp_path / "worker.log"
    previous = current_app._get_current_object()
    celery_app.set_current()  # the platform's tasks are sent through the current app
    with log.open("wb") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "config.celery", "worker", "-Q", DATASETS_QUEUE,
             "--pool", "prefork", "-c", "1", "--loglevel", "INFO", "-n", f"datasets-test-{os.getpid()}@%h"],
            cwd=REPO_ROOT / "platform", env=env, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        previous.set_current()
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        print(log.read_text()[-4000:])  # shown when the test fails


def _wait_for(predicate, worker, what: str):
    deadline = time.monotonic() + WORKER_DEADLINE_S
    while not predicate():
        assert worker.poll() is None, "the datasets worker exited"
        assert time.monotonic() < deadline, f"the datasets worker did not {what} in {WORKER_DEADLINE_S} s"
        time.sleep(0.2)


def test_the_datasets_worker_stores_an_accepted_upload_and_counts_its_tokens(datasets_worker, api, user, project):
    response = upload(api, project, "support", jsonl(*[conversation(f"{n}?", str(n)) for n in range(2500)]),
                      store=False)
    assert response.status_code == 202, response.content
    version_id = response.json()["latest_version"]["id"]
    detail = f"/api/datasets/{response.json()['id']}/versions/1/"

    def ready() -> bool:
        return api.get(detail).json()["status"] == "ready"

    _wait_for(ready, datasets_worker, "store the version")
    version = DatasetVersion.objects.get(pk=version_id)
    assert (version.rows_stored, version.kept_file) == (2500, "")
    assert DatasetRow.objects.filter(version=version).count() == 2500
    assert not any((django_settings.MEDIA_ROOT / "dataset-uploads").iterdir())  # the kept file is gone

    # The byte counts were asked for when the rows were stored; the worker counted them once.
    _wait_for(lambda: DatasetTokenStats.objects.filter(version=version, status="ready").exists(),
              datasets_worker, "count the tokens")
    browser = Client()
    browser.force_login(user)
    page = browser.get(f"/datasets/{version.dataset_id}/").content.decode()
    # Bytes: "Be brief." 9 and the question and answer of each row.
    expected = sum(9 + len(f"{n}?") + len(str(n)) for n in range(2000))
    assert f'<dd id="tokens-total">{expected}</dd>' in page
    assert DatasetTokenStats.objects.filter(version=version).count() == 1
