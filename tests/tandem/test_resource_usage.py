"""One sampler of process and host figures, of which a process may hold several."""

from __future__ import annotations

import time

import psutil
import pytest

from tandem.runtime.resource_usage import ResourceSampler, return_freed_memory


def _burn_cpu(seconds: float) -> float:
    """Spin until this process used ``seconds`` more CPU; the CPU seconds it used."""
    start = time.process_time()
    while time.process_time() - start < seconds:
        sum(range(1000))
    return time.process_time() - start


class _Clock:
    def __init__(self):
        self.instants: list[float] = []

    def __call__(self) -> float:
        self.instants.append(time.time())
        return self.instants[-1]


def test_two_samplers_in_one_process_each_cover_the_time_since_their_own_previous_sample():
    # As the trainer's process reporter and device monitor: neither cuts the other's interval short.
    first_clock, second_clock = _Clock(), _Clock()
    first = ResourceSampler(clock=first_clock, baseline=True)
    before_second = _burn_cpu(0.3)
    second = ResourceSampler(clock=second_clock, baseline=True)
    both = _burn_cpu(0.3)

    first_usage, second_usage = first.sample(), second.sample()

    first_wall = first_clock.instants[1] - first_clock.instants[0]
    second_wall = second_clock.instants[1] - second_clock.instants[0]
    # psutil counts CPU in clock ticks (10 ms): within a few ticks.
    assert first_usage.cpu_cores * first_wall == pytest.approx(before_second + both, abs=0.05)
    assert second_usage.cpu_cores * second_wall == pytest.approx(both, abs=0.05)
    for usage in (first_usage, second_usage):
        assert 0.0 <= usage.host_cpu_percent <= 100.0
        assert 0 < usage.host_memory_used_bytes <= usage.host_memory_total_bytes and usage.rss_bytes > 0


def test_without_a_baseline_the_first_sample_is_the_average_since_the_process_started():
    sampler = ResourceSampler()

    usage = sampler.sample()

    assert usage.host_cpu_percent is None  # nothing to compare the host's counters with yet
    assert usage.cpu_cores > 0 and sampler.started_at < usage.at


def test_freed_memory_goes_back_to_the_host():
    # Blocks under glibc's mmap threshold, freed with the last one kept: glibc keeps their pages in
    # its heap (nothing at its top to trim by itself) until told to give them back.
    process = psutil.Process()
    blocks = [bytes(1000) + bytes([index % 256]) for index in range(200_000)]
    last = blocks[-1]
    held = process.memory_info().rss
    del blocks
    still_held = process.memory_info().rss
    assert still_held > held - 100 * 2**20  # the allocator kept the freed pages

    return_freed_memory()

    assert process.memory_info().rss < still_held - 100 * 2**20
    assert last  # kept alive to the end
