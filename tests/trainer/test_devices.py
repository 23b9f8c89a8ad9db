"""Device reports: kind, memory, duty cycle and MFU, per device and per host, only where they can be known."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import pytest

from tandem.contracts import DeviceReport, StageSpan, StepTimeline, TrainerStepEvent
from trainer.devices import (
    DeviceMonitor,
    NvmlGpu,
    normalise_pci_bus_id,
    nvml_index_for_device,
    parameter_count,
    peak_flops_per_device,
    per_device,
    training_flops,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


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


def test_on_cpu_the_report_has_the_duty_cycle_host_figures_and_mfu_of_a_measured_peak_but_no_device_memory():
    clock = [0.0]
    monitor = DeviceMonitor(parameters=1000, attention_width=64, interval_s=10.0, clock=lambda: clock[0])
    assert monitor.due()  # the first step reports at once
    monitor.observe(_timeline(100.0, data_wait=1.0, compute=3.0), tokens=64, length=32)
    monitor.observe(_timeline(104.0, compute=1.0, publish=1.0), tokens=64, length=32)

    report = monitor.sample()

    assert (report.platform, report.device_kind) == ("cpu", jax.devices()[0].device_kind)
    assert report.device_count == len(jax.devices()) and report.local_device_count >= 1
    assert report.duty_cycle == pytest.approx(4.0 / 6.0)
    # No data sheet for a CPU: the peak is a matmul timed when the monitor started, and says so.
    assert report.peak_flops_source == "measured_matmul" and report.peak_flops_per_device > 1e8
    flops = 2 * (6 * 1000 * 64 + 12 * 64 * 32 * 64)
    assert report.mfu == pytest.approx(flops / 6.0 / (report.peak_flops_per_device * report.device_count))
    assert report.memory_in_use_bytes is None and report.gpu_utilisation is None
    assert report.process_rss_bytes > 0 and report.host_memory_total_bytes > report.host_memory_used_bytes > 0
    assert 0.0 <= report.host_cpu_percent <= 100.0
    values = report.metric_values()
    assert values["device/duty_cycle"] == pytest.approx(4.0 / 6.0)
    assert values["device/mfu"] == report.mfu and "device/memory_in_use_bytes" not in values
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


def test_model_flops_count_the_attention_over_the_sequence_as_palm_does():
    # SmolLM2-135M: 30 layers of 9 heads of 64; 1,024 tokens of a 1,024-token row.
    assert training_flops(parameters=134_515_008, tokens=1024, attention_width=30 * 9 * 64, length=1024) == (
        6 * 134_515_008 * 1024 + 12 * 17_280 * 1024 * 1024)
    assert training_flops(parameters=10, tokens=3) == 180


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


def _four_device_report() -> dict:
    """Run in a child whose XLA gives it 4 CPU devices: a report after two observed steps."""
    monitor = DeviceMonitor(parameters=1000, interval_s=10.0)
    monitor.observe(_timeline(0.0, data_wait=1.0, compute=1.0), tokens=64)
    monitor.observe(_timeline(2.0, compute=2.0), tokens=64)
    return monitor.sample().model_dump(mode="json")


@pytest.fixture(scope="module")
def four_device_report() -> DeviceReport:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    completed = subprocess.run([sys.executable, "-m", "tests.trainer.test_devices"], cwd=REPO_ROOT, env=env,
                               capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr[-4000:]
    return DeviceReport.model_validate(json.loads(completed.stdout.strip().splitlines()[-1]))


def test_each_local_device_has_its_own_row(four_device_report):
    report = four_device_report

    assert (report.device_count, report.local_device_count, report.process_index) == (4, 4, 0)
    assert [device.id for device in report.devices] == [0, 1, 2, 3]
    assert {(device.platform, device.device_kind, device.process_index) for device in report.devices} == {
        ("cpu", "cpu", 0)}
    assert report.hostname and report.process_id > 0


def test_on_cpu_devices_report_no_allocator_memory_and_the_mfu_of_a_measured_peak(four_device_report):
    for device in four_device_report.devices:
        assert (device.memory_in_use_bytes, device.memory_peak_bytes, device.memory_limit_bytes) == (
            None, None, None)
        assert device.mfu == four_device_report.mfu
    assert four_device_report.memory_in_use_bytes is None
    assert four_device_report.peak_flops_source == "measured_matmul" and four_device_report.mfu > 0


def test_every_device_has_the_trainers_duty_cycle(four_device_report):
    # One SPMD program on the whole mesh: compute 3 s of 4 s wall, on every device.
    assert [device.duty_cycle for device in four_device_report.devices] == [pytest.approx(0.75)] * 4
    assert four_device_report.duty_cycle == pytest.approx(0.75)


def test_without_nvml_or_libtpu_their_figures_are_absent_not_made_up(four_device_report):
    # This host has neither an NVIDIA driver nor libtpu: every figure of theirs is None.
    for device in four_device_report.devices:
        assert device.model_dump(include={
            "nvml_index", "nvml_utilisation", "nvml_memory_used_bytes", "nvml_memory_total_bytes",
            "tpu_duty_cycle", "tpu_hbm_used_bytes", "tpu_hbm_total_bytes"}) == dict.fromkeys([
                "nvml_index", "nvml_utilisation", "nvml_memory_used_bytes", "nvml_memory_total_bytes",
                "tpu_duty_cycle", "tpu_hbm_used_bytes", "tpu_hbm_total_bytes"])
    assert four_device_report.gpu_utilisation is None and four_device_report.tpu_duty_cycle is None


def test_a_report_without_device_rows_from_an_older_trainer_still_reads():
    report = DeviceReport.model_validate({"platform": "gpu", "device_kind": "NVIDIA H100 80GB HBM3",
                                          "device_count": 8, "local_device_count": 8, "reported_at": 1.0})
    assert report.devices == [] and report.hostname is None


# NVML's view of a host with four identical GPUs, listed in PCI bus order as NVML lists them.
H100S = [NvmlGpu(index=i, pci_bus_id=f"00000000:{bus}:00.0", uuid=f"GPU-{i}aaa-{i}", name="NVIDIA H100 80GB HBM3")
         for i, bus in enumerate(["18", "2A", "3A", "5D"])]
MIXED = [NvmlGpu(index=0, pci_bus_id="00000000:18:00.0", uuid="GPU-0aaa", name="NVIDIA L4"),
         NvmlGpu(index=1, pci_bus_id="00000000:2A:00.0", uuid="GPU-1aaa", name="NVIDIA A100-SXM4-80GB")]


def _index(local_hardware_id, *, gpus=H100S, pci_bus_id=None, visible=None, order=None):
    return nvml_index_for_device(local_hardware_id=local_hardware_id, pci_bus_id=pci_bus_id, gpus=gpus,
                                 visible_devices=visible, device_order=order)


def test_pci_bus_ids_match_whatever_their_spelling():
    assert normalise_pci_bus_id("00000000:3A:00.0") == normalise_pci_bus_id("0000:3a:00.0") == "0000:3a:00.0"
    assert _index(0, pci_bus_id="0000:5d:00.0", visible="3") == 3
    assert _index(0, pci_bus_id="0000:99:00.0") is None  # a bus NVML does not list: no figures


def test_cuda_ordinals_map_through_cuda_visible_devices():
    assert [_index(i) for i in range(4)] == [0, 1, 2, 3]
    assert [_index(i, visible="2,0") for i in range(2)] == [2, 0]
    assert _index(0, visible="GPU-3aaa") == 3  # a UUID prefix names its GPU
    assert _index(2, visible="2,0") is None  # no third visible GPU


def test_an_uncertain_match_gives_no_figures_rather_than_another_gpus():
    # Mixed GPUs: CUDA's default order (fastest first) need not be NVML's.
    assert _index(0, gpus=MIXED) is None
    assert _index(0, gpus=MIXED, visible="1") is None
    assert _index(0, gpus=MIXED, order="PCI_BUS_ID") == 0
    assert _index(0, gpus=MIXED, visible="GPU-1aaa") == 1
    assert _index(0, visible="MIG-6f1e5c3a-aaaa") is None  # a MIG slice: NVML's GPU figures are the parent's
    assert _index(0, visible="GPU-") is None  # ambiguous prefix
    assert _index(0, visible="") is None and _index(None) is None and _index(0, gpus=[]) is None


def test_libtpu_figures_are_laid_over_devices_only_where_the_counts_line_up():
    assert per_device([10.0, 20.0], 2, per_chip=True) == [10.0, 20.0]
    assert per_device([10.0, 20.0], 4, per_chip=True) == [10.0, 10.0, 20.0, 20.0]  # two cores a chip
    assert per_device([1.0, 2.0], 4, per_chip=False) == [None] * 4  # memory is not shared out
    assert per_device([1.0, 2.0, 3.0], 2, per_chip=True) == [None, None]
    assert per_device(None, 3, per_chip=True) == [None] * 3


if __name__ == "__main__":
    print(json.dumps(_four_device_report()))
