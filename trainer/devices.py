"""The trainer's accelerators and host, as a :class:`DeviceReport` every few seconds.

Everything here is read where the platform reports it and left None where it
does not: no memory figures on CPU, no MFU on a device kind whose peak is not
in :data:`PEAK_BF16_FLOPS`, no NVML figures without ``pynvml`` (the
``nvidia-ml-py`` package) or an NVIDIA driver, no libtpu figures off TPU.
"""

from __future__ import annotations

import logging
import time

import jax
import psutil

from tandem.contracts import DeviceReport, StepTimeline

logger = logging.getLogger(__name__)

# Peak dense bf16 FLOP/s of one device, from the vendors' data sheets, matched
# against `device_kind` by substring, first match wins (so "H100 PCIe" before
# "H100"). A kind not listed gets no MFU rather than a guess.
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756e12),
    ("H100", 989e12),  # SXM; "NVIDIA H100 80GB HBM3"
    ("H200", 989e12),
    ("H20", 148e12),
    ("GH200", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("A10G", 70e12),
    ("TPU v6 lite", 918e12),  # v6e (Trillium)
    ("TPU v6e", 918e12),
    ("TPU v5 lite", 197e12),  # v5e
    ("TPU v5e", 197e12),
    ("TPU v5p", 459e12),
    ("TPU v5", 459e12),  # v5p reports itself as "TPU v5"
    ("TPU v4", 275e12),
    ("TPU v3", 123e12),
    ("TPU v2", 45e12),
)


def peak_flops_per_device(device_kind: str) -> float | None:
    for pattern, flops in PEAK_BF16_FLOPS:
        if pattern.lower() in device_kind.lower():
            return flops
    return None


def parameter_count(params) -> int:
    return sum(int(leaf.size) for leaf in jax.tree.leaves(params) if hasattr(leaf, "size"))


def training_flops(*, parameters: int, tokens: int) -> float:
    """Model FLOPs of a training step: 6 per parameter per token (forward 2, backward 4).

    The usual approximation (Kaplan et al.; PaLM's MFU): it leaves out the
    attention's quadratic term and any extra forward pass (a reference policy),
    so MFU is, if anything, understated.
    """
    return 6.0 * parameters * tokens


def _memory_stats() -> tuple[int | None, int | None, int | None]:
    in_use = peak = limit = None
    for device in jax.local_devices():
        try:
            stats = device.memory_stats()
        except Exception:  # noqa: BLE001 - backends without it raise (or return None)
            stats = None
        if not stats:
            continue
        if "bytes_in_use" in stats:
            in_use = (in_use or 0) + int(stats["bytes_in_use"])
        if "peak_bytes_in_use" in stats:
            peak = (peak or 0) + int(stats["peak_bytes_in_use"])
        if "bytes_limit" in stats:
            limit = (limit or 0) + int(stats["bytes_limit"])
    return in_use, peak, limit


class _Nvml:
    """Utilisation and memory of this host's NVIDIA GPUs, when pynvml and a driver are there."""

    def __init__(self):
        self._pynvml = None
        try:
            import pynvml  # optional: nvidia-ml-py
            pynvml.nvmlInit()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self._pynvml = pynvml
        except Exception:  # noqa: BLE001 - not installed, no driver, no GPU: absent
            self._handles = []

    def sample(self) -> tuple[float | None, int | None]:
        if self._pynvml is None or not self._handles:
            return None, None
        try:
            utilisation = [self._pynvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0 for h in self._handles]
            memory = sum(int(self._pynvml.nvmlDeviceGetMemoryInfo(h).used) for h in self._handles)
        except Exception as exc:  # noqa: BLE001 - a driver hiccup must not stop training
            logger.debug("NVML sample failed: %s", exc)
            return None, None
        return sum(utilisation) / len(utilisation), memory


def _tpu_duty_cycle() -> float | None:
    """libtpu's own TensorCore duty cycle, where its monitoring SDK is there."""
    try:
        from libtpu.sdk import tpumonitoring  # optional: only on TPU hosts
        values = [float(value) for value in tpumonitoring.get_metric("duty_cycle_pct").data()]
    except Exception:  # noqa: BLE001 - not a TPU host, or an older libtpu
        return None
    return sum(values) / len(values) / 100.0 if values else None


class DeviceMonitor:
    """Accumulates each step's timeline and FLOPs; samples a :class:`DeviceReport` every ``interval_s``.

    ``observe`` is called every step and costs a few additions; the sample
    itself (allocator stats, NVML, psutil) happens at most once per interval.
    """

    def __init__(self, *, parameters: int, interval_s: float = 10.0, clock=time.monotonic):
        self.interval_s = interval_s
        self._clock = clock
        self._parameters = parameters
        devices = jax.devices()
        self.platform = jax.default_backend()
        self.device_kind = devices[0].device_kind
        self.device_count = len(devices)
        self.local_device_count = jax.local_device_count()
        self.peak_flops = peak_flops_per_device(self.device_kind) if self.platform != "cpu" else None
        self._nvml = _Nvml() if self.platform == "gpu" else None
        self._process = psutil.Process()
        self._process_cpu_s = self._cpu_seconds()
        psutil.cpu_percent(interval=None)  # the baseline of the first report's host CPU figure
        self._last_sample: float | None = None
        self._last_sample_wall = time.monotonic()
        self._wall_s = self._compute_s = self._flops = 0.0

    def _cpu_seconds(self) -> float:
        times = self._process.cpu_times()
        return times.user + times.system

    def observe(self, timeline: StepTimeline, *, tokens: int) -> None:
        seconds = timeline.seconds_by_stage()
        self._wall_s += sum(seconds.values())
        self._compute_s += seconds.get("compute", 0.0)
        self._flops += training_flops(parameters=self._parameters, tokens=tokens)

    def due(self) -> bool:
        return self._last_sample is None or self._clock() - self._last_sample >= self.interval_s

    def sample(self) -> DeviceReport:
        """A report over the steps observed since the last one; starts the next window."""
        self._last_sample = self._clock()
        in_use, peak, limit = _memory_stats()
        gpu_utilisation, gpu_memory = self._nvml.sample() if self._nvml is not None else (None, None)
        now = time.monotonic()
        elapsed = now - self._last_sample_wall
        cpu_s = self._cpu_seconds()
        process_cpu_cores = (cpu_s - self._process_cpu_s) / elapsed if elapsed > 0 else None
        self._process_cpu_s, self._last_sample_wall = cpu_s, now
        memory = psutil.virtual_memory()
        wall = self._wall_s
        mfu = None
        if self.peak_flops is not None and wall > 0:
            mfu = self._flops / wall / (self.peak_flops * self.device_count)
        report = DeviceReport(
            platform=self.platform, device_kind=self.device_kind, device_count=self.device_count,
            local_device_count=self.local_device_count,
            memory_in_use_bytes=in_use, memory_peak_bytes=peak, memory_limit_bytes=limit,
            duty_cycle=self._compute_s / wall if wall > 0 else None,
            mfu=mfu, peak_flops_per_device=self.peak_flops,
            gpu_utilisation=gpu_utilisation, gpu_memory_used_bytes=gpu_memory,
            tpu_duty_cycle=_tpu_duty_cycle() if self.platform == "tpu" else None,
            host_cpu_percent=psutil.cpu_percent(interval=None),
            host_memory_used_bytes=int(memory.total - memory.available),
            host_memory_total_bytes=int(memory.total),
            process_cpu_cores=process_cpu_cores,
            process_rss_bytes=int(self._process.memory_info().rss),
            reported_at=time.time(),
        )
        self._wall_s = self._compute_s = self._flops = 0.0
        return report
