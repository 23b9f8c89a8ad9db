"""Payloads as other processes send them."""

from __future__ import annotations

import time

from tandem.contracts import TrainerStepEvent


def step_event(run_id: int, step: int, **overrides) -> dict:
    """A TrainerStepEvent as the trainer posts it (JSON), with 11 metric values."""
    event = {
        "run_id": run_id,
        "step": step,
        "phase": "rl",
        "policy_version": step,
        "wall_s": 1.0,
        "wait_s": 0.25,
        "compute_s": 0.5,
        "publish_s": 0.1,
        "other_s": 0.15,
        "loss": 1.0 / (step + 1),
        "reward_mean": 0.1 * step,
        "success_rate": 0.05 * step,
        "emitted_at": time.time(),
    }
    event.update(overrides)
    return TrainerStepEvent.model_validate(event).model_dump(mode="json")


POINTS_PER_STEP_EVENT = len(TrainerStepEvent.model_validate(step_event(1, 1)).metric_values())


def device_report(*, gpus: int = 4, **overrides) -> dict:
    """A DeviceReport as a trainer on a host of ``gpus`` H100s sends it, with a row per device."""
    rows = [
        {"id": index, "process_index": 0, "local_hardware_id": index, "platform": "gpu",
         "device_kind": "NVIDIA H100 80GB HBM3", "memory_in_use_bytes": (10 + index) * 2**30,
         "memory_peak_bytes": (20 + index) * 2**30, "memory_limit_bytes": 76 * 2**30, "duty_cycle": 0.62,
         "mfu": 0.41, "nvml_index": index, "nvml_utilisation": 0.9 - index / 10,
         "nvml_memory_used_bytes": (12 + index) * 2**30, "nvml_memory_total_bytes": 80 * 2**30}
        for index in range(gpus)
    ]
    report = {"platform": "gpu", "device_kind": "NVIDIA H100 80GB HBM3", "device_count": gpus,
              "local_device_count": gpus, "memory_in_use_bytes": sum(r["memory_in_use_bytes"] for r in rows),
              "duty_cycle": 0.62, "mfu": 0.41, "peak_flops_per_device": 989e12, "host_cpu_percent": 37.0,
              "host_memory_used_bytes": 100 * 2**30, "host_memory_total_bytes": 2000 * 2**30,
              "process_cpu_cores": 1.5, "process_rss_bytes": 6 * 2**30, "hostname": "gpu-host-1",
              "process_id": 4242, "process_index": 0, "devices": rows, "reported_at": time.time()}
    report.update(overrides)
    return report
