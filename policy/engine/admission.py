"""How long the engine holds its next decode chunk for the turns that just-finished rows will bring.

A turn that joins the batch just after a chunk starts waits that whole chunk in the queue. Whoever
got a finished turn back usually sends the next soon (the episode's next turn, or the next
episode): an agent loop in the same process within a millisecond or two, an agent program through
its OpenAI-compatible endpoint within tens of milliseconds. Starting the next chunk at once leaves
their rows empty for it. :class:`RefillHold` learns how soon finished rows are refilled, and holds a
chunk for the refills, as long as they usually take, only while most come within a small fraction
of a chunk's time; when the environment or agent is slow (they come later, or not at all), it does
not hold.

Pure host bookkeeping with an injected clock: :class:`~policy.engine.engine.InferenceEngine` calls it
under its lock.
"""

from __future__ import annotations

import collections
import math


class RefillHold:
    """Refill latencies of recently finished rows, and the hold they justify.

    Each finished row waits for a refill: the next request submitted is matched to the oldest
    waiting row, and the time between them is one sample. A row not refilled within the limit
    (``fraction`` of the last chunk's seconds) is a miss. The hold lasts, after the newest waiting
    row finished, the ``quantile`` of the recent refills that came within the limit, and ends
    as soon as every waiting row is refilled. There is none while fewer than ``min_hit_rate`` of
    recent samples came within the limit, before ``min_samples`` samples, or when no finished row
    waits. A hold that waits on a miss costs that typical latency, well under the limit; one that
    catches a refill saves that row a whole chunk.

    Args:
      fraction: the most a hold may last, as a fraction of the last chunk's seconds; 0 never holds.
      window: samples kept (the most recent).
      quantile: share of recent in-time refills a hold must be long enough to catch.
      min_hit_rate: share of recent samples that must have come within the limit.
      min_samples: samples needed before any hold.
    """

    def __init__(self, fraction: float, *, window: int = 64, quantile: float = 0.95, min_hit_rate: float = 0.5,
                 min_samples: int = 8):
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"fraction must be in [0, 1], not {fraction}")
        if not 0.0 < quantile <= 1.0:
            raise ValueError(f"quantile must be in (0, 1], not {quantile}")
        self._fraction = fraction
        self._quantile = quantile
        self._min_hit_rate = min_hit_rate
        self._min_samples = min_samples
        self._latencies: collections.deque[float] = collections.deque(maxlen=window)
        self._waiting: collections.deque[float] = collections.deque()  # finish times, oldest first
        self._chunk_s = 0.0

    @property
    def waiting(self) -> int:
        """Finished rows not refilled yet."""
        return len(self._waiting)

    def chunk_ran(self, seconds: float) -> None:
        """A decode chunk took ``seconds``: the scale of the limit."""
        self._chunk_s = seconds

    def finished(self, rows: int, now: float) -> None:
        """A chunk ended ``rows`` turns at ``now``: each waits for a refill (never, when holds are off)."""
        if self._fraction > 0:
            self._waiting.extend([now] * rows)

    def submitted(self, now: float) -> None:
        """A request arrived at ``now``: it refills the oldest waiting row, if any."""
        if self._waiting:
            self._latencies.append(now - self._waiting.popleft())

    def hold_until(self, now: float) -> float | None:
        """When the next chunk should start at the latest, if it should wait for refills; else None.

        First forgets the rows that waited past the limit, as misses.
        """
        limit = self._fraction * self._chunk_s
        while self._waiting and now - self._waiting[0] > limit:
            self._waiting.popleft()
            self._latencies.append(math.inf)
        if not self._waiting or limit <= 0 or len(self._latencies) < self._min_samples:
            return None
        hits = sorted(latency for latency in self._latencies if latency <= limit)
        if not hits or len(hits) < self._min_hit_rate * len(self._latencies):
            return None
        typical = hits[min(len(hits) - 1, math.ceil(self._quantile * len(hits)) - 1)]
        return self._waiting[-1] + typical
