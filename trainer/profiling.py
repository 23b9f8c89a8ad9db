"""The trainer step's stage timeline: what each second of the training loop was spent on.

A :class:`StageRecorder` is cheap enough to run on every step (two clock reads
per stage, well under a microsecond each): see ``bench/profiling_overhead.py``.
Consecutive steps share their boundary, so every second of the loop belongs to
exactly one step, and a step's stages sum to its wall time.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from tandem.contracts import UNRECORDED_STAGE, StageSpan, StepTimeline, TrainerStage


class StageRecorder:
    """Records the named stages of the current step; the time between them is ``UNRECORDED_STAGE`` (other).

    ``clock`` measures durations (monotonic); host timestamps are ``clock``
    readings shifted onto unix time once per step, so stage boundaries are
    exact to each other and close to the wall clock. Both are injectable for tests.
    """

    def __init__(self, *, clock=time.perf_counter, wall_clock=time.time):
        self._clock = clock
        self._wall_clock = wall_clock
        self._spans: list[tuple[str, float, float]] = []
        self._step_started = 0.0
        self._unix_offset = 0.0
        self.start()

    def start(self) -> None:
        """Begin a step now, forgetting any stage recorded since the last one."""
        self._spans = []
        self._step_started = self._clock()
        self._unix_offset = self._wall_clock() - self._step_started

    @contextmanager
    def stage(self, name: TrainerStage) -> Iterator[None]:
        began = self._clock()
        try:
            yield
        finally:
            self._spans.append((name, began, self._clock()))

    def finish(self) -> StepTimeline:
        """The step's contiguous timeline up to now; the next step begins at this very instant."""
        ended = self._clock()
        spans, cursor = [], self._step_started
        for name, began, stage_ended in self._spans:
            if began > cursor:
                spans.append((UNRECORDED_STAGE, cursor, began))
            spans.append((name, began, stage_ended))
            cursor = stage_ended
        if ended > cursor:
            spans.append((UNRECORDED_STAGE, cursor, ended))
        offset = self._unix_offset
        timeline = StepTimeline(spans=[
            StageSpan(name=name, started_at=began + offset, ended_at=stage_ended + offset)
            for name, began, stage_ended in spans
        ])
        self._spans = []
        self._step_started = ended
        return timeline


def timeline_wall_s(timeline: StepTimeline) -> float:
    if not timeline.spans:
        return 0.0
    return timeline.spans[-1].ended_at - timeline.spans[0].started_at
