"""The trainer's accelerators and host, as a :class:`DeviceReport` every few seconds.

A report has a row (:class:`DeviceSample`) for each local device beside the
host's sums: allocator memory, NVML or libtpu figures of that device, and the
trainer's duty cycle and MFU, which are the same on every device of the mesh.

Everything here is read where the platform reports it and left None where it
does not: no memory figures on CPU, no MFU on an accelerator whose peak is not
in :data:`PEAK_BF16_FLOPS` (on CPU the peak is a measured matmul's, and the report
says so: ``peak_flops_source``), no NVML figures without ``pynvml`` (the
``nvidia-ml-py`` package) or an NVIDIA driver, no libtpu figures off TPU.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass

import jax

from tandem.contracts import DeviceReport, DeviceSample, StepTimeline
from tandem.runtime.process_reports import TrainerDevice
from tandem.runtime.resource_usage import ResourceSampler

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


def attention_width(model) -> int:
    """``layers x heads x head_dim`` of a policy (or of a ``PolicyWithValue``'s policy): its attention's
    share of the model FLOPs per token and position (:func:`training_flops`)."""
    config = getattr(model, "policy", model).config
    return config.num_layers * config.num_heads * config.head_dim


def parameter_count(params) -> int:
    return sum(int(leaf.size) for leaf in jax.tree.leaves(params) if hasattr(leaf, "size"))


def training_flops(*, parameters: int, tokens: int, attention_width: int = 0, length: int = 0) -> float:
    """Model FLOPs of a training step: 6 per parameter per token (forward 2, backward 4), plus the
    attention's, PaLM's ``12 x layers x heads x head_dim x sequence length`` per token.

    ``attention_width``: ``layers x heads x head_dim`` of the model; ``length``: the batch's padded
    sequence length. As in PaLM's MFU, any extra forward pass (a reference policy, a rematerialised
    block) is left out: that is hardware FLOPs, not model FLOPs, so MFU is, if anything, understated.
    """
    return 6.0 * parameters * tokens + 12.0 * attention_width * length * tokens


@functools.cache
def measured_matmul_flops(*, size: int = 1024, repeats: int = 5) -> float:
    """FLOP/s of the best of ``repeats`` float32 ``size x size`` matmuls on the default device, compiled
    and warmed up: the peak MFU divides by where no data sheet has one (a CPU). Measured once per process:
    a trainer builds a DeviceMonitor for every run it claims."""
    left = jax.random.normal(jax.random.key(0), (size, size), jax.numpy.float32)
    right = jax.random.normal(jax.random.key(1), (size, size), jax.numpy.float32)
    product = jax.jit(jax.numpy.dot)
    product(left, right).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        product(left, right).block_until_ready()
        best = min(best, time.perf_counter() - started)
    return 2.0 * size**3 / best


@dataclass(frozen=True)
class AllocatorStats:
    """One device's XLA allocator figures; each None where the backend does not report it."""

    in_use: int | None = None
    peak: int | None = None
    limit: int | None = None


def allocator_stats(device) -> AllocatorStats:
    try:
        stats = device.memory_stats()
    except Exception:  # noqa: BLE001 - backends without it raise (or return None)
        stats = None
    if not stats:
        return AllocatorStats()
    figure = lambda key: int(stats[key]) if key in stats else None  # noqa: E731
    return AllocatorStats(in_use=figure("bytes_in_use"), peak=figure("peak_bytes_in_use"),
                          limit=figure("bytes_limit"))


def trainer_device() -> TrainerDevice:
    """This process's accelerator, for its reports: the memory XLA may use on the smallest of its
    accelerator devices, and their platform. Both None on CPU, whose allocator reports no limit (the
    host's memory is the operator's to declare)."""
    accelerators = [device for device in jax.local_devices() if device.platform != "cpu"]
    limits = [limit for limit in (allocator_stats(device).limit for device in accelerators) if limit is not None]
    return TrainerDevice(memory_bytes=min(limits) if limits else None,
                         platform=accelerators[0].platform if accelerators else None)


def _sum_reported(values: list[int | None]) -> int | None:
    """The sum of the values some device reported; None when none did."""
    reported = [value for value in values if value is not None]
    return sum(reported) if reported else None


# -- NVML ---------------------------------------------------------------------------


@dataclass(frozen=True)
class NvmlGpu:
    """A GPU as NVML lists it (NVML numbers GPUs in PCI bus order, whatever CUDA_VISIBLE_DEVICES says)."""

    index: int
    pci_bus_id: str
    uuid: str
    name: str


def normalise_pci_bus_id(bus_id: str) -> str:
    """'00000000:3B:00.0' (NVML) and '0000:3b:00.0' (CUDA) alike -> '0000:3b:00.0'."""
    bus_id = bus_id.strip().lower()
    domain, sep, rest = bus_id.partition(":")
    if not sep or not rest:
        return bus_id
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return bus_id


def nvml_index_for_device(
    *, local_hardware_id: int | None, pci_bus_id: str | None, gpus: Sequence[NvmlGpu],
    visible_devices: str | None, device_order: str | None,
) -> int | None:
    """NVML's index of a JAX GPU device, or None when the match is not certain.

    By PCI bus id when the device exposes one: certain. Otherwise by its CUDA
    ordinal (``local_hardware_id``), which counts the GPUs CUDA_VISIBLE_DEVICES
    lets the process see, in the order it lists them. An entry given as a UUID
    names its GPU outright; an entry given as a number, and the whole list when
    the variable is unset, counts in CUDA's enumeration order, which is NVML's
    (PCI bus) order only with CUDA_DEVICE_ORDER=PCI_BUS_ID or on a host of
    identical GPUs (CUDA's default puts the fastest first and equal GPUs in
    PCI bus order). On a host of mixed GPUs without PCI_BUS_ID, on a MIG
    instance, or with an entry CUDA would not accept either, the answer is None:
    a wrong GPU's figures would be worse than none.
    """
    if pci_bus_id:
        wanted = normalise_pci_bus_id(pci_bus_id)
        return next((gpu.index for gpu in gpus if normalise_pci_bus_id(gpu.pci_bus_id) == wanted), None)
    if local_hardware_id is None or local_hardware_id < 0:
        return None
    in_pci_order = sorted(gpus, key=lambda gpu: normalise_pci_bus_id(gpu.pci_bus_id))
    cuda_order_is_pci_order = device_order == "PCI_BUS_ID" or len({gpu.name for gpu in gpus}) == 1
    if visible_devices is None:
        visible = in_pci_order if cuda_order_is_pci_order else None
    else:
        visible = []
        for entry in (part.strip() for part in visible_devices.split(",")):
            if entry.isdigit() and cuda_order_is_pci_order and int(entry) < len(in_pci_order):
                visible.append(in_pci_order[int(entry)])
            elif entry.lower().startswith("gpu-"):
                matches = [gpu for gpu in gpus if gpu.uuid.lower().startswith(entry.lower())]
                if len(matches) != 1:
                    return None
                visible.append(matches[0])
            else:  # MIG-..., a number in an unknown order, or something CUDA stops at
                return None
    if visible is None or local_hardware_id >= len(visible):
        return None
    return visible[local_hardware_id].index


@dataclass(frozen=True)
class NvmlFigures:
    utilisation: float
    memory_used_bytes: int
    memory_total_bytes: int


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _Nvml:
    """Utilisation and memory of this host's NVIDIA GPUs, when pynvml and a driver are there."""

    def __init__(self):
        self._pynvml = None
        self._handles: list = []
        self.gpus: list[NvmlGpu] = []
        try:
            import pynvml  # optional: nvidia-ml-py
            pynvml.nvmlInit()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self.gpus = [
                NvmlGpu(index=i, pci_bus_id=_text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
                        uuid=_text(pynvml.nvmlDeviceGetUUID(handle)), name=_text(pynvml.nvmlDeviceGetName(handle)))
                for i, handle in enumerate(self._handles)
            ]
            self._pynvml = pynvml
        except Exception:  # noqa: BLE001 - not installed, no driver, no GPU: absent
            self._handles, self.gpus = [], []

    def index_of(self, device) -> int | None:
        if self._pynvml is None:
            return None
        return nvml_index_for_device(
            local_hardware_id=getattr(device, "local_hardware_id", None),
            # Not every jaxlib exposes it; where it does, it settles the match.
            pci_bus_id=getattr(device, "pci_bus_id", None),
            gpus=self.gpus, visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
            device_order=os.environ.get("CUDA_DEVICE_ORDER"),
        )

    def sample(self) -> dict[int, NvmlFigures]:
        """Figures by NVML index; empty when NVML is absent or a read failed."""
        if self._pynvml is None or not self._handles:
            return {}
        try:
            figures = {}
            for index, handle in enumerate(self._handles):
                memory = self._pynvml.nvmlDeviceGetMemoryInfo(handle)
                figures[index] = NvmlFigures(
                    utilisation=self._pynvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0,
                    memory_used_bytes=int(memory.used), memory_total_bytes=int(memory.total),
                )
        except Exception as exc:  # noqa: BLE001 - a driver hiccup must not stop training
            logger.debug("NVML sample failed: %s", exc)
            return {}
        return figures


# -- libtpu ---------------------------------------------------------------------------


def per_device(values: Sequence[float] | None, device_count: int, *, per_chip: bool) -> list[float | None]:
    """libtpu's list of figures laid over the host's devices, in order; Nones where they do not line up.

    One figure per device maps one to one. A figure of a chip (the duty cycle)
    is shared by the devices on that chip when the chips hold equal numbers of
    devices (TPU v2/v3: two). Any other count is not guessed at.
    """
    if not values:
        return [None] * device_count
    if len(values) == device_count:
        return list(values)
    if per_chip and device_count % len(values) == 0:
        devices_per_chip = device_count // len(values)
        return [values[i // devices_per_chip] for i in range(device_count)]
    return [None] * device_count


def _tpu_metric(name: str) -> list[float] | None:
    """One of libtpu's monitoring metrics, a value per chip or core, where its SDK is there."""
    try:
        from libtpu.sdk import tpumonitoring  # optional: only on TPU hosts
        return [float(value) for value in tpumonitoring.get_metric(name).data()]
    except Exception:  # noqa: BLE001 - not a TPU host, or an older libtpu
        return None


@dataclass(frozen=True)
class TpuFigures:
    duty_cycle: list[float | None]  # per local device, 0-1
    hbm_used_bytes: list[float | None]
    hbm_total_bytes: list[float | None]
    mean_duty_cycle: float | None


def _tpu_figures(device_count: int) -> TpuFigures:
    duty = _tpu_metric("duty_cycle_pct")
    return TpuFigures(
        duty_cycle=[None if value is None else value / 100.0
                    for value in per_device(duty, device_count, per_chip=True)],
        hbm_used_bytes=per_device(_tpu_metric("hbm_capacity_usage"), device_count, per_chip=False),
        hbm_total_bytes=per_device(_tpu_metric("hbm_capacity_total"), device_count, per_chip=False),
        mean_duty_cycle=sum(duty) / len(duty) / 100.0 if duty else None,
    )


def _int_or_none(value: float | None) -> int | None:
    return None if value is None else int(value)


class DeviceMonitor:
    """Accumulates each step's timeline and FLOPs; samples a :class:`DeviceReport` every ``interval_s``.

    ``observe`` is called every step and costs a few additions; the sample
    itself (allocator stats, NVML, the host's CPU and memory) happens at most once per interval.
    """

    def __init__(self, *, parameters: int, attention_width: int = 0, interval_s: float = 10.0,
                 clock=time.monotonic):
        self.interval_s = interval_s
        self._clock = clock
        self._parameters = parameters
        self._attention_width = attention_width
        devices = jax.devices()
        self.platform = jax.default_backend()
        self.device_kind = devices[0].device_kind
        self.device_count = len(devices)
        self.local_devices = jax.local_devices()
        self.local_device_count = len(self.local_devices)
        self.process_index = jax.process_index()
        if self.platform == "cpu":
            self.peak_flops, self.peak_flops_source = measured_matmul_flops(), "measured_matmul"
        else:
            self.peak_flops = peak_flops_per_device(self.device_kind)
            self.peak_flops_source = "data_sheet" if self.peak_flops is not None else None
        self._nvml = _Nvml() if self.platform == "gpu" else None
        # Which NVML entry each local device is; fixed for the life of the process.
        self._nvml_indices = [self._nvml.index_of(device) if self._nvml is not None else None
                              for device in self.local_devices]
        self._hostname = socket.gethostname()
        # Its own sampler, apart from the process reporter's: each report's rates cover its own interval.
        self._usage = ResourceSampler(baseline=True)
        self._last_sample: float | None = None
        self._wall_s = self._compute_s = self._flops = 0.0

    def observe(self, timeline: StepTimeline, *, tokens: int, length: int = 0) -> None:
        """Count a step of ``timeline`` that trained ``tokens`` in rows padded to ``length``."""
        seconds = timeline.seconds_by_stage()
        self._wall_s += sum(seconds.values())
        self._compute_s += seconds.get("compute", 0.0)
        self._flops += training_flops(parameters=self._parameters, tokens=tokens,
                                      attention_width=self._attention_width, length=length)

    def due(self) -> bool:
        return self._last_sample is None or self._clock() - self._last_sample >= self.interval_s

    def sample(self) -> DeviceReport:
        """A report over the steps observed since the last one; starts the next window."""
        self._last_sample = self._clock()
        allocator = [allocator_stats(device) for device in self.local_devices]
        nvml = self._nvml.sample() if self._nvml is not None else {}
        tpu = _tpu_figures(self.local_device_count) if self.platform == "tpu" else None
        usage = self._usage.sample()
        wall = self._wall_s
        duty_cycle = self._compute_s / wall if wall > 0 else None
        mfu = None
        if self.peak_flops is not None and wall > 0:
            mfu = self._flops / wall / (self.peak_flops * self.device_count)
        devices = []
        for position, (device, stats) in enumerate(zip(self.local_devices, allocator, strict=True)):
            nvml_index = self._nvml_indices[position]
            gpu = nvml.get(nvml_index) if nvml_index is not None else None
            devices.append(DeviceSample(
                id=device.id, process_index=device.process_index,
                local_hardware_id=getattr(device, "local_hardware_id", None),
                platform=device.platform, device_kind=device.device_kind,
                memory_in_use_bytes=stats.in_use, memory_peak_bytes=stats.peak, memory_limit_bytes=stats.limit,
                duty_cycle=duty_cycle, mfu=mfu,
                nvml_index=nvml_index if gpu is not None else None,
                nvml_utilisation=gpu.utilisation if gpu else None,
                nvml_memory_used_bytes=gpu.memory_used_bytes if gpu else None,
                nvml_memory_total_bytes=gpu.memory_total_bytes if gpu else None,
                tpu_duty_cycle=tpu.duty_cycle[position] if tpu else None,
                tpu_hbm_used_bytes=_int_or_none(tpu.hbm_used_bytes[position]) if tpu else None,
                tpu_hbm_total_bytes=_int_or_none(tpu.hbm_total_bytes[position]) if tpu else None,
            ))
        report = DeviceReport(
            platform=self.platform, device_kind=self.device_kind, device_count=self.device_count,
            local_device_count=self.local_device_count,
            memory_in_use_bytes=_sum_reported([stats.in_use for stats in allocator]),
            memory_peak_bytes=_sum_reported([stats.peak for stats in allocator]),
            memory_limit_bytes=_sum_reported([stats.limit for stats in allocator]),
            duty_cycle=duty_cycle, mfu=mfu, peak_flops_per_device=self.peak_flops,
            peak_flops_source=self.peak_flops_source,
            # Every GPU of the host, as before: NVML sees them whether or not this process uses them.
            gpu_utilisation=(sum(gpu.utilisation for gpu in nvml.values()) / len(nvml)) if nvml else None,
            gpu_memory_used_bytes=sum(gpu.memory_used_bytes for gpu in nvml.values()) if nvml else None,
            tpu_duty_cycle=tpu.mean_duty_cycle if tpu else None,
            host_cpu_percent=usage.host_cpu_percent,
            host_memory_used_bytes=usage.host_memory_used_bytes,
            host_memory_total_bytes=usage.host_memory_total_bytes,
            process_cpu_cores=usage.cpu_cores,
            process_rss_bytes=usage.rss_bytes,
            hostname=self._hostname, process_id=self._usage.process.pid, process_index=self.process_index,
            devices=devices,
            reported_at=time.time(),
        )
        self._wall_s = self._compute_s = self._flops = 0.0
        return report
