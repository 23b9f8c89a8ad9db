"""The platform defines and sends its tasks on its own Celery app, whichever app is current.

Creating a ``Celery(...)`` makes it the process's current app. A library's, a test's, or the
trainer's entry point run in-process once took the platform's probes, exports and dataset stores
to that app's broker; two pytest processes made it show (tests/test_suite_processes.py).
"""

from __future__ import annotations

import json

import pytest
from celery import Celery, current_app

from common.tasks import send_task
from config.celery import app as platform_app
from dataset_registry.tasks import store_dataset_version
from tandem.contracts import DATASET_STORE_VERSION, PROBE, PROBE_QUEUE


@pytest.fixture
def another_app_is_current():
    previous = current_app._get_current_object()
    # A broker nothing listens on: a task sent through this app would fail or go nowhere.
    intruder = Celery("intruder", broker="redis://127.0.0.1:9/0")
    assert current_app._get_current_object() is intruder
    yield intruder
    previous.set_current()


def _queued_task_names(redis_client, queue: str) -> list[str]:
    return [json.loads(raw)["headers"]["task"] for raw in redis_client.lrange(queue, 0, -1)]


def test_a_send_by_route_reaches_the_platforms_broker(another_app_is_current, redis_client):
    redis_client.delete(PROBE_QUEUE)

    send_task(PROBE, 424242)

    assert _queued_task_names(redis_client, PROBE_QUEUE) == [PROBE.name]
    redis_client.delete(PROBE_QUEUE)


def test_a_platform_tasks_delay_reaches_the_platforms_broker(another_app_is_current, redis_client):
    assert store_dataset_version.app is platform_app
    redis_client.delete(DATASET_STORE_VERSION.queue)

    store_dataset_version.delay(424242)

    assert _queued_task_names(redis_client, DATASET_STORE_VERSION.queue) == [DATASET_STORE_VERSION.name]
    redis_client.delete(DATASET_STORE_VERSION.queue)
