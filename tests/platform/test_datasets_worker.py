"""The datasets worker for real: a Celery worker process on the platform-datasets queue (prefork, as
`tandem platform-worker --queues platform-datasets` runs it) stores an accepted upload's rows and
counts its tokens, while the upload's answer came at once."""

from __future__ import annotations

import pytest
from django.conf import settings as django_settings
from django.test import Client

from dataset_registry.models import DatasetRow, DatasetTokenStats, DatasetVersion
from tandem.contracts import DATASETS_QUEUE
from tests.platform.queue_workers import platform_queue_worker
from tests.polling import poll_until

from .test_datasets_api import conversation, jsonl, upload

# How long the test waits for the worker: a bound for a stuck worker, not a measure of speed.
WORKER_DEADLINE_S = 120


@pytest.fixture
def datasets_worker(transactional_db, tmp_path, redis_client, settings):
    """A real worker process of the datasets queue, on the test database and this test's media root."""
    redis_client.delete(DATASETS_QUEUE)  # nothing queued by an earlier session
    media = tmp_path / "media"
    settings.MEDIA_ROOT = media
    with platform_queue_worker(DATASETS_QUEUE, log=tmp_path / "worker.log",
                               env={"TANDEM_MEDIA_ROOT": str(media)}) as process:
        yield process


def _wait_for(predicate, worker, what: str):
    def worker_alive() -> None:
        assert worker.poll() is None, "the datasets worker exited"

    poll_until(predicate, timeout_s=WORKER_DEADLINE_S, interval_s=0.2, between=worker_alive,
               what=f"the datasets worker to {what}")


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
