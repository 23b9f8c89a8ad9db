"""Devices, host and producer processes as series of a run: stored from step events, kept after it ends."""

from __future__ import annotations

import pytest

from runs.services import run_transition
from tandem.contracts import RunStatus, producer_metric_name
from telemetry.services import metric_events_record

from .builders import full_rl_step_event

pytestmark = pytest.mark.django_db

SYSTEM_SERIES = (
    "device/duty_cycle", "device/2/memory_in_use_bytes", "device/2/nvml_utilisation", "host/cpu_percent",
    "trainer/rss_bytes", "producers/rss_bytes", "producers/rollouts-1@gpu-host-2:311/cpu_cores",
    "producers/rollouts-1@gpu-host-2:311/utilisation", "producers/rollouts-1@gpu-host-2:311/rss_bytes",
)


def test_device_host_and_producer_series_are_still_readable_after_the_run_finishes(api, running_run):
    metric_events_record(run=running_run, events=[full_rl_step_event(running_run.pk, step) for step in (1, 2)])
    run_transition(run=running_run, to_status=RunStatus.FINISHED, reason="done")

    response = api.get(f"/api/runs/{running_run.pk}/metrics/", {"names": ",".join(SYSTEM_SERIES)})

    assert response.status_code == 200
    points = {(point["name"], point["step"]): point["value"] for point in response.json()["points"]}
    assert {name for name, _ in points} == set(SYSTEM_SERIES)
    assert points[("producers/rollouts-1@gpu-host-2:311/cpu_cores", 2)] == 3.5
    assert points[("device/2/memory_in_use_bytes", 1)] == 12 * 2**30


def test_a_long_worker_name_keeps_its_host_and_pid_within_the_series_name_limit():
    name = producer_metric_name("rollouts-" + "x" * 80 + "@gpu-host-17.cluster.example:4242", "utilisation")

    assert len(name) == 64
    assert name.startswith("producers/~") and name.endswith("gpu-host-17.cluster.example:4242/utilisation")
