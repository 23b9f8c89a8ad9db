"""The suite's pytest-xdist processes (``make test``) each have services of their own.

Without it one process's Celery workers would take another's tasks from a shared Redis database,
and rows with equal ids in the two test databases would share Redis keys and media files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.conftest import REPO_ROOT


def test_this_process_has_a_redis_database_a_channels_prefix_and_a_media_folder_of_its_own(settings):
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        assert settings.REDIS_URL.endswith("/0")
        return
    index = int(worker.removeprefix("gw"))
    assert settings.REDIS_URL.endswith(f"/{index + 1}")
    assert settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"].endswith(f":{worker}")
    assert settings.MEDIA_ROOT.name == worker


def test_a_process_started_by_a_test_keeps_the_services_it_inherits():
    """Children inherit the rewritten variables and PYTEST_XDIST_WORKER: loading the settings again changes nothing."""
    script = ("import json, os, django; django.setup(); from django.conf import settings; "
              "print(json.dumps([settings.REDIS_URL, settings.CHANNEL_LAYERS['default']['CONFIG']['prefix'], "
              "str(settings.MEDIA_ROOT)]))")
    parent = {"TANDEM_TEST_REDIS_URL": "redis://127.0.0.1:1/0", "TANDEM_TEST_CHANNELS_PREFIX": "suite:channels",
              "PYTEST_XDIST_WORKER": "gw3"}
    env = {**os.environ, **parent, "DJANGO_SETTINGS_MODULE": "config.settings.test",
           "PYTHONPATH": f"{REPO_ROOT}{os.pathsep}{REPO_ROOT / 'platform'}"}
    env.pop("TANDEM_MEDIA_ROOT", None)

    def settings_in_child(child_env):
        completed = subprocess.run([sys.executable, "-c", script], env=child_env, capture_output=True, text=True,
                                   timeout=120, cwd=REPO_ROOT)
        assert completed.returncode == 0, completed.stderr[-2000:]
        return json.loads(completed.stdout.strip().splitlines()[-1])

    first = settings_in_child(env)
    assert first[:2] == ["redis://127.0.0.1:1/4", "suite:channels:gw3"]
    assert first[2].endswith("/var/media/gw3")
    inherited = {**env, "TANDEM_TEST_REDIS_URL": first[0], "TANDEM_TEST_CHANNELS_PREFIX": first[1],
                 "TANDEM_MEDIA_ROOT": first[2]}
    assert settings_in_child(inherited) == first


def test_the_end_to_end_files_are_one_unit_of_work_and_every_other_file_its_own():
    from tests.conftest import _FilesWithTheStacksInTurn

    scheduler = object.__new__(_FilesWithTheStacksInTurn)  # its scopes need none of a live run's state
    scopes = {nodeid: scheduler._split_scope(nodeid) for nodeid in (
        "tests/e2e/test_pipeline.py::test_a", "tests/e2e/test_restarts.py::test_b[1]",
        "tests/platform/test_runs_api.py::test_c", "tests/platform/test_runs_api.py::Suite::test_d",
        "tests/test_task_table.py::test_e")}
    assert scopes == {
        "tests/e2e/test_pipeline.py::test_a": "tests/e2e", "tests/e2e/test_restarts.py::test_b[1]": "tests/e2e",
        "tests/platform/test_runs_api.py::test_c": "tests/platform/test_runs_api.py",
        "tests/platform/test_runs_api.py::Suite::test_d": "tests/platform/test_runs_api.py",
        "tests/test_task_table.py::test_e": "tests/test_task_table.py"}
