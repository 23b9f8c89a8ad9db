"""The engine's hold for refills (policy/engine/admission.py), on a clock the test sets."""

from __future__ import annotations

import pytest

from policy.engine.admission import RefillHold


def _learned(hold: RefillHold, latencies: list[float], *, chunk_s: float = 1.0, start: float = 0.0) -> float:
    """Rows finished and refilled after each of ``latencies``, one chunk apart; the clock after them."""
    now = start
    for latency in latencies:
        hold.chunk_ran(chunk_s)
        hold.finished(1, now)
        hold.submitted(now + latency)
        now += chunk_s
    return now


def test_quick_refills_hold_the_next_chunk_for_their_usual_latency_and_no_longer_once_refilled():
    hold = RefillHold(0.1, min_samples=4)
    now = _learned(hold, [0.002 * step for step in range(1, 21)])
    hold.finished(3, now)
    # The 0.95 quantile of 0.002, 0.004, ..., 0.04 is 0.038: the chunk waits until then for the three rows' refills.
    assert hold.hold_until(now) == pytest.approx(now + 0.038)
    hold.submitted(now + 0.001)
    hold.submitted(now + 0.002)
    assert hold.waiting == 1 and hold.hold_until(now + 0.002) == pytest.approx(now + 0.038)
    hold.submitted(now + 0.003)
    assert hold.waiting == 0 and hold.hold_until(now + 0.003) is None


def test_no_hold_before_enough_samples_nor_without_a_finished_row():
    hold = RefillHold(0.1, min_samples=4)
    now = _learned(hold, [0.01, 0.01, 0.01])
    hold.finished(1, now)
    assert hold.hold_until(now) is None  # three samples of four
    hold.submitted(now + 0.01)
    assert hold.hold_until(now + 0.01) is None  # nothing waits
    hold.finished(1, now + 1)
    assert hold.hold_until(now + 1) == pytest.approx(now + 1.01)


def test_slow_refills_never_hold_a_chunk():
    """An environment slower than a tenth of a chunk: holding would idle the device for nothing."""
    hold = RefillHold(0.1, min_samples=4)
    now = _learned(hold, [0.5] * 8)
    hold.finished(2, now)
    assert hold.hold_until(now) is None


def test_rows_never_refilled_are_misses_and_holds_stop_when_they_are_most_rows():
    """A run winding down: the rows it ends are not refilled. A hold waits on them only the usual latency of
    the refills that do come, and stops once misses are more than half the samples."""
    hold = RefillHold(0.1, min_samples=4, window=10)
    now = _learned(hold, [0.01] * 4 + [0.02] * 4)
    for _ in range(2):
        hold.finished(1, now)
        assert hold.hold_until(now) == pytest.approx(now + 0.02)
        # Past the limit (0.1 of the last 1 s chunk) the row is a miss and is forgotten.
        assert hold.hold_until(now + 0.2) is None and hold.waiting == 0
        now += 1.0
    hold.finished(1, now)
    # The window holds the last 10 samples: 8 refills and 2 misses; each miss after pushes out a refill.
    assert hold.hold_until(now) == pytest.approx(now + 0.02)
    assert hold.hold_until(now + 0.2) is None
    for _ in range(3):
        hold.finished(1, now)
        hold.hold_until(now + 0.2)
        now += 1.0
    hold.finished(1, now)
    assert hold.hold_until(now) is None  # 4 refills, 6 misses


def test_the_limit_scales_with_the_last_chunk():
    hold = RefillHold(0.1, min_samples=4)
    now = _learned(hold, [0.05] * 6, chunk_s=1.0)
    hold.chunk_ran(0.2)  # a chunk of fewer rows: refills of 0.05 s are now past 0.1 * 0.2 s
    hold.finished(1, now)
    assert hold.hold_until(now) is None


def test_a_fraction_of_zero_never_holds_and_bad_settings_are_refused():
    hold = RefillHold(0.0, min_samples=1)
    now = _learned(hold, [0.0, 0.0])
    hold.finished(1, now)
    assert hold.hold_until(now) is None
    assert hold.waiting == 0  # nothing is kept for holds that never come
    with pytest.raises(ValueError, match="fraction"):
        RefillHold(1.5)
    with pytest.raises(ValueError, match="quantile"):
        RefillHold(0.1, quantile=0.0)
