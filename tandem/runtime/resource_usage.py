"""This process's CPU and memory and its host's, with the CPU as rates since the previous sample.

One sampler for every figure of this kind that a Tandem process reports: the
:class:`~tandem.contracts.ProcessReport` of every process (``tandem/runtime/process_reports.py``)
and the trainer's :class:`~tandem.contracts.DeviceReport` (``trainer/devices.py``)
each hold a :class:`ResourceSampler` of their own, so that each one's rates cover
exactly the time since its own previous report.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class ResourceUsage:
    """One sample: the process's and the host's figures, the CPU ones since the previous sample."""

    at: float  # the sampler's clock
    cpu_cores: float  # this process's CPU seconds per wall second
    rss_bytes: int
    host_cpu_count: int
    host_cpu_percent: float | None  # 0-100 over all CPUs; None without a previous sample of the host
    host_memory_used_bytes: int  # total less available
    host_memory_total_bytes: int


@dataclass(frozen=True)
class _CpuCounters:
    at: float
    process_cpu_s: float
    host_busy_s: float
    host_total_s: float


def _host_cpu_times() -> tuple[float, float]:
    """``(busy, total)`` CPU seconds of the host since boot, counted as ``psutil.cpu_percent`` counts them.

    Computed here rather than by ``psutil.cpu_percent(interval=None)``, whose
    baseline is shared by every caller in the process: two callers (the trainer
    has a process reporter and a device monitor) would cut each other's intervals short.
    """
    times = psutil.cpu_times()
    total = sum(times)
    if sys.platform.startswith("linux"):
        # Linux counts guest time inside user and nice as well.
        total -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
    idle = times.idle + getattr(times, "iowait", 0.0)
    return total - idle, total


class ResourceSampler:
    """Samples this process (or ``process``) and its host; each sample's CPU rates cover the time since the previous.

    ``baseline``: read the CPU counters now, so that the first sample covers the
    time since the sampler was made. Without it, the first sample has the
    process's average since it started and no host CPU figure. ``clock``
    (seconds) is injectable so tests can control time.
    """

    def __init__(self, *, process: psutil.Process | None = None, clock: Callable[[], float] = time.time,
                 baseline: bool = False):
        self.process = process or psutil.Process()
        self._clock = clock
        self.started_at = self.process.create_time()
        self._previous: _CpuCounters | None = self._counters()[0] if baseline else None

    def _counters(self) -> tuple[_CpuCounters, int]:
        now = self._clock()
        with self.process.oneshot():
            cpu = self.process.cpu_times()
            rss = self.process.memory_info().rss
        host_busy_s, host_total_s = _host_cpu_times()
        counters = _CpuCounters(at=now, process_cpu_s=cpu.user + cpu.system, host_busy_s=host_busy_s,
                                host_total_s=host_total_s)
        return counters, rss

    def sample(self) -> ResourceUsage:
        current, rss = self._counters()
        previous, self._previous = self._previous, current
        if previous is None:
            # No previous sample: the process's average since it started; the host's is unknown.
            cpu_cores = current.process_cpu_s / max(current.at - self.started_at, 1e-3)
            host_cpu_percent = None
        else:
            cpu_cores = (max(current.process_cpu_s - previous.process_cpu_s, 0.0)
                         / max(current.at - previous.at, 1e-3))
            host_total = current.host_total_s - previous.host_total_s
            # No clock tick of the host between the two samples: none was busy either (as psutil says).
            host_cpu_percent = (
                min(max(100.0 * (current.host_busy_s - previous.host_busy_s) / host_total, 0.0), 100.0)
                if host_total > 0 else 0.0
            )
        memory = psutil.virtual_memory()
        return ResourceUsage(
            at=current.at, cpu_cores=cpu_cores, rss_bytes=int(rss), host_cpu_count=psutil.cpu_count() or 1,
            host_cpu_percent=host_cpu_percent, host_memory_used_bytes=int(memory.total - memory.available),
            host_memory_total_bytes=int(memory.total),
        )


def return_freed_memory() -> None:
    """Hand the memory of what was just released back to the host.

    Once a run's arrays and engines are gone, their buffers sit free in the allocator's arenas:
    glibc keeps freed memory inside the process, so the resident size would stay at the run's
    peak while the process idles or serves a smaller run. A collection first breaks the cycles
    that still hold arrays, then ``malloc_trim`` returns the free pages (a no-op without glibc).
    """
    gc.collect()
    release_free_pages()


def release_free_pages() -> None:
    """``malloc_trim``: the allocator's free pages go back to the host (a no-op without glibc).

    Cheap enough after each compilation: XLA's compiler frees its working memory (hundreds of MB
    for a train step) into glibc's heap, which keeps it, fragmented, so the arrays allocated after
    it add to the resident size instead of reusing it. SmolLM2's step at 64 x 1,024 tokens on CPU:
    a 4.64 GB resident peak, 4.16 GB with the pages given back after the state's build and the
    step's compilation.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: its allocator keeps its own policy
