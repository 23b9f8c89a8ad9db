"""Device reports: kind, memory, duty cycle and MFU, only where they can be known."""

import time

import jax
import pytest

from tandem.contracts import StageSpan, StepTimeline, TrainerStepEvent
from trainer.devices import DeviceMonitor, parameter_count, peak_flops_per_device, training_flops


@pytest.mark.parametrize(("kind", "peak"), [
    ("NVIDIA H100 80GB HBM3", 989e12),
    ("NVIDIA H100 PCIe", 756e12),
    ("NVIDIA H200", 989e12),
    ("NVIDIA A100-SXM4-80GB", 312e12),
    ("TPU v4", 275e12),
    ("TPU v5 lite", 197e12),
    ("TPU v5", 459e12),
    ("TPU v6 lite", 918e12),
])
def test_known_device_kinds_have_their_data_sheet_peak(kind, peak):
    assert peak_flops_per_device(kind) == peak


@pytest.mark.parametrize("kind", ["cpu", "AMD EPYC 9654", "NVIDIA GeForce GTX 1080"])
def test_unknown_device_kinds_have_no_peak(kind):
    assert peak_flops_per_device(kind) is None


def test_training_flops_are_six_per_parameter_per_token():
    assert training_flops(parameters=1_000_000, tokens=512) == 6 * 1_000_000 * 512
    assert parameter_count({"w": jax.numpy.zeros((3, 4)), "b": jax.numpy.zeros(4)}) == 16


def _timeline(start: float, **seconds: float) -> StepTimeline:
    spans, cursor = [], start
    for name, duration in seconds.items():
        spans.append(StageSpan(name=name, started_at=cursor, ended_at=cursor + duration))
        cursor += duration
    return StepTimeline(spans=spans)


def test_on_cpu_the_report_has_the_duty_cycle_and_host_figures_but_no_mfu_or_device_memory():
    clock = [0.0]
    monitor = DeviceMonitor(parameters=1000, interval_s=10.0, clock=lambda: clock[0])
    assert monitor.due()  # the first step reports at once
    monitor.observe(_timeline(100.0, data_wait=1.0, compute=3.0), tokens=64)
    monitor.observe(_timeline(104.0, compute=1.0, publish=1.0), tokens=64)

    report = monitor.sample()

    assert (report.platform, report.device_kind) == ("cpu", jax.devices()[0].device_kind)
    assert report.device_count == len(jax.devices()) and report.local_device_count >= 1
    assert report.duty_cycle == pytest.approx(4.0 / 6.0)
    assert report.mfu is None and report.peak_flops_per_device is None
    assert report.memory_in_use_bytes is None and report.gpu_utilisation is None
    assert report.process_rss_bytes > 0 and report.host_memory_total_bytes > report.host_memory_used_bytes > 0
    assert 0.0 <= report.host_cpu_percent <= 100.0
    values = report.metric_values()
    assert values["device/duty_cycle"] == pytest.approx(4.0 / 6.0)
    assert "device/mfu" not in values and "device/memory_in_use_bytes" not in values
    assert values["trainer/rss_bytes"] == report.process_rss_bytes
    # Not due again until the interval has passed; the next window starts empty.
    assert not monitor.due()
    clock[0] += 10.0
    assert monitor.due()
    assert monitor.sample().duty_cycle is None


def test_mfu_is_model_flops_per_wall_second_over_the_devices_peak():
    monitor = DeviceMonitor(parameters=10**9, interval_s=10.0)
    # As on an H100 host: the peak is the only thing the CPU backend cannot tell.
    monitor.peak_flops, monitor.device_count = 989e12, 8
    monitor.observe(_timeline(0.0, data_wait=0.5, compute=1.5), tokens=100_000)

    report = monitor.sample()

    assert report.mfu == pytest.approx(6 * 10**9 * 100_000 / 2.0 / (989e12 * 8))
    assert report.peak_flops_per_device == 989e12


def test_a_report_travels_with_the_step_event():
    monitor = DeviceMonitor(parameters=10, interval_s=1.0)
    monitor.observe(_timeline(time.time(), compute=0.5), tokens=1)
    report = monitor.sample()
    event = TrainerStepEvent(run_id=1, step=1, phase="sft", policy_version=0, wall_s=0.5, wait_s=0.0,
                             compute_s=0.5, publish_s=0.0, other_s=0.0, loss=1.0, device=report,
                             emitted_at=time.time())

    values = TrainerStepEvent.model_validate_json(event.model_dump_json()).metric_values()
    assert values["device/count"] == float(len(jax.devices()))
    assert values["device/duty_cycle"] == 1.0
