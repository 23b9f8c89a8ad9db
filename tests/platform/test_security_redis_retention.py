"""Finding 9 of the security audit (Redis hygiene): a run that ended does not keep its keys forever.

Before, every finished run's streams and whole weights blob stayed in Redis.
"""

from __future__ import annotations

import pytest

from runs.services import run_transition
from tandem.contracts import RunStatus, trajectory_stream, weights_key


@pytest.fixture
def run_with_keys(make_run, redis_client):
    run = make_run()
    redis_client.hset(weights_key(run.pk), mapping={"version": 3, "blob": b"x" * 1024})
    redis_client.xadd(trajectory_stream(run.pk), {"record": "{}"})
    yield run
    redis_client.delete(weights_key(run.pk), trajectory_stream(run.pk))


def _ttls(redis_client, run) -> list[int]:
    return [redis_client.ttl(weights_key(run.pk)), redis_client.ttl(trajectory_stream(run.pk))]


def test_an_ended_runs_keys_expire_after_the_retention(run_with_keys, redis_client, settings,
                                                      django_capture_on_commit_callbacks):
    settings.TANDEM_ENDED_RUN_KEYS_RETENTION_S = 600
    with django_capture_on_commit_callbacks(execute=True):
        run_transition(run=run_with_keys, to_status=RunStatus.CANCELLED)

    assert all(0 < ttl <= 600 for ttl in _ttls(redis_client, run_with_keys))


def test_a_failed_run_keeps_its_keys_longer_and_a_resume_keeps_them_for_good(
    run_with_keys, redis_client, settings, django_capture_on_commit_callbacks
):
    settings.TANDEM_ENDED_RUN_KEYS_RETENTION_S = 600
    settings.TANDEM_RELEASED_RUN_KEYS_RETENTION_S = 86_400
    with django_capture_on_commit_callbacks(execute=True):
        run_transition(run=run_with_keys, to_status=RunStatus.FAILED, reason="trainer died")
    assert all(600 < ttl <= 86_400 for ttl in _ttls(redis_client, run_with_keys))

    with django_capture_on_commit_callbacks(execute=True):
        run_transition(run=run_with_keys, to_status=RunStatus.QUEUED)
    assert _ttls(redis_client, run_with_keys) == [-1, -1]  # no expiry
