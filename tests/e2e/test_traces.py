"""Profiling with real processes: a user asks for a trace, the trainer takes it, the platform keeps it.

Web server and trainer are real processes on a database and Redis db of their
own; the run is SFT only, so no producers are needed.
"""

from __future__ import annotations

import io
import time
import zipfile
from collections import defaultdict

import pytest

from tandem.cli.stack import LocalStack
from tests.e2e.conftest import private_stack, user_api

SFT_STEPS, TRACED_STEPS = 8, 2


@pytest.fixture
def own_stack(tmp_path):
    with private_stack(tmp_path, workers=1, log_lines=40) as stack:
        yield stack


def _wait_for(predicate, *, timeout_s: float, what: str, stack: LocalStack):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stack.check_alive()
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"{what} did not happen within {timeout_s}s")


@pytest.mark.timeout(900)  # above its inner waits (tests/test_timeouts.py)
def test_a_requested_trace_of_the_next_steps_is_captured_by_the_trainer_and_served(own_stack):
    stack = own_stack
    credentials = stack.prepare()
    stack.start_web()
    # A run waits until its environment's probe passed: a worker runs it, the platform worker records it.
    stack.start_platform_worker()
    stack.start_workers()
    api = user_api(stack, credentials)
    run_id = api.post("/api/runs/", json={
        "project": credentials.project_id, "name": "traced", "environment": "calculator",
        "config": {"algorithm": {"name": "sft"}, "sft_steps": SFT_STEPS, "rl_steps": 0},
    }).json()["id"]
    requested = api.post(f"/api/runs/{run_id}/traces/", json={"steps": TRACED_STEPS})
    assert requested.status_code == 201, requested.text
    trace_id = requested.json()["id"]

    stack.start_trainer(trainer_token=credentials.trainer_token)

    def captured():
        traces = api.get(f"/api/runs/{run_id}/traces/").json()["results"]
        return traces[0] if traces and traces[0]["status"] != "requested" else None

    trace = _wait_for(captured, timeout_s=300, what="the trace upload", stack=stack)
    assert trace["id"] == trace_id and trace["status"] == "captured", trace
    assert trace["last_step"] - trace["first_step"] + 1 == TRACED_STEPS
    assert trace["first_step"] >= 1 and trace["last_step"] <= SFT_STEPS
    download = api.get(trace["download_url"])
    assert download.status_code == 200 and len(download.content) == trace["size_bytes"]
    names = zipfile.ZipFile(io.BytesIO(download.content)).namelist()
    # jax.profiler's own output, as XProf (TensorBoard's profile plugin) and Perfetto open it.
    assert any(name.startswith("plugins/profile/") and name.endswith(".xplane.pb") for name in names), names
    assert any(name.endswith(".trace.json.gz") for name in names), names
    stored = list((stack.config.var_dir / "media" / "traces" / f"run-{run_id}").iterdir())
    assert [path.stat().st_size for path in stored] == [trace["size_bytes"]]

    _wait_for(lambda: api.get(f"/api/runs/{run_id}/").json()["status"] == "finished", timeout_s=300,
              what="the run's end", stack=stack)
    points = api.get(f"/api/runs/{run_id}/metrics/", params={"limit": 5000}).json()["points"]
    by_step: dict[int, dict[str, float]] = defaultdict(dict)
    for point in points:
        by_step[point["step"]][point["name"]] = point["value"]
    assert sorted(by_step) == list(range(1, SFT_STEPS + 1))
    for step, values in by_step.items():
        stages = {name: value for name, value in values.items() if name.startswith("stage/")}
        # Every step has its stages, and they add up to its wall time.
        assert {"stage/batch_s", "stage/host_to_device_s", "stage/compute_s"} <= stages.keys(), (step, stages)
        assert sum(stages.values()) == pytest.approx(values["wall_s"], rel=1e-6, abs=1e-6)
        assert values["trainer_utilisation"] == pytest.approx(values["stage/compute_s"] / values["wall_s"])
    # The first step carries a device report: on CPU, the kind and count, an MFU over a measured matmul
    # peak (no data sheet for a CPU), and no device memory.
    first = by_step[1]
    assert first["device/count"] >= 1 and first["trainer/rss_bytes"] > 0
    assert first["device/mfu"] > 0 and "device/memory_in_use_bytes" not in first
    devices = api.get(f"/api/runs/{run_id}/devices/").json()["report"]
    assert (devices["platform"], devices["memory_in_use_bytes"]) == ("cpu", None)
    assert devices["peak_flops_source"] == "measured_matmul" and devices["mfu"] > 0
    assert devices["device_kind"] and devices["process_rss_bytes"] > 0
    # A row per local device, each with the trainer's duty cycle and MFU and, on CPU, no allocator memory.
    assert [row["id"] for row in devices["devices"]] == list(range(devices["local_device_count"]))
    assert all(row["memory_in_use_bytes"] is None and row["mfu"] == devices["mfu"] for row in devices["devices"])
    # Tracing is charted where it cost time: the steps around the trace spent it in telemetry.
    assert max(values.get("stage/telemetry_s", 0.0) for values in by_step.values()) > 0
