"""The trainer's step events: built from what a step did, and posted to the platform in batches."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import httpx
import numpy as np

from tandem.contracts import (
    IDLE_STAGE,
    StepTimeline,
    TraceRequest,
    TrainerStepEvent,
    TrajectoryRecord,
)
from trainer.devices import DeviceMonitor
from trainer.platform_client import (
    PlatformClient,
    PlatformUnavailableError,
    is_unavailable,
    retry_delays,
)
from trainer.profiling import timeline_wall_s
from trainer.rollout_stats import succeeded
from trainer.trajectory_samples import TrajectorySampleBuffer

logger = logging.getLogger(__name__)


# Events kept while the platform does not answer. Past this many the batcher waits for it,
# holding training up, rather than drop any.
MAX_BUFFERED_EVENTS = 2000


@dataclass
class StepEventBatcher:
    """Posts step events every ``interval_s``, so a fast SFT phase does not make one request per step.

    While the platform is unreachable (restarting, say) the events stay pending and
    training goes on; they are posted, in order, once it answers again.
    """

    platform: PlatformClient
    run_id: int
    interval_s: float
    # Receives the pending trace requests the platform returns with each post.
    on_trace_requests: Callable[[list[TraceRequest]], None] = lambda requests: None
    pending: list[TrainerStepEvent] = field(default_factory=list)
    last_flush: float = 0.0
    # Sampled trajectories go out with the events (the trajectory browser's data).
    trajectories: TrajectorySampleBuffer | None = None
    # While the platform is unreachable: no post before this (monotonic) time, and the backoff's delays.
    retry_at: float = 0.0
    _delays: Iterator[float] | None = None

    def emit(self, event: TrainerStepEvent) -> None:
        self.pending.append(event)
        now = time.monotonic()
        if now - self.last_flush >= self.interval_s and now >= self.retry_at:
            self.flush()

    def flush(self, *, wait: bool = False) -> None:
        """Post the pending events; ``wait`` (the run's end) retries until the platform takes them.

        A platform that does not answer keeps them pending, to be posted at a later
        flush, unless the buffer is full (``MAX_BUFFERED_EVENTS``): then this waits too.
        """
        wait = wait or len(self.pending) >= MAX_BUFFERED_EVENTS
        if self.pending:
            try:
                # Bodies the platform refuses as invalid are logged and skipped by post_events;
                # what raises here is a platform that is away (or one that keeps failing).
                reply = self.platform.post_events(self.run_id, self.pending, retries=None if wait else 0)
            except (PlatformUnavailableError, httpx.HTTPStatusError) as exc:
                self._delays = self._delays or retry_delays()
                delay = next(self._delays)
                self.retry_at = time.monotonic() + delay
                logger.warning("run %s: telemetry not posted (%s); %d step events kept, next post in %.1fs",
                               self.run_id, exc, len(self.pending), delay)
                self.last_flush = time.monotonic()
                if wait and not is_unavailable(exc):
                    raise  # the platform fails these events every time: a bug to report, not to wait out
                return
            self.pending = []
            self._delays = None
            self.retry_at = 0.0
            self.on_trace_requests(reply.trace_requests)
        if self.trajectories is not None:
            self.trajectories.flush()
        self.last_flush = time.monotonic()


def profile_fields(timeline: StepTimeline, *, tokens: int, padded_tokens: int, length: int, updates: int = 1,
                   devices: DeviceMonitor) -> dict:
    """A step event's stage fields, tokens/s and padding, from its timeline, and a device report when one is due.

    ``tokens``: the step's batch tokens; ``padded_tokens``: the slots of its padded batch (rows x
    length), ``length`` its padded sequence length. ``updates``: optimizer updates run on that batch; each
    costs the model FLOPs of its tokens, but tokens/s counts the batch's tokens once, as
    samples/s counts its samples.
    """
    seconds = timeline.seconds_by_stage()
    wall_s = timeline_wall_s(timeline)
    wait_s, compute_s, publish_s = (seconds.get(name, 0.0) for name in (IDLE_STAGE, "compute", "publish"))
    devices.observe(timeline, tokens=tokens * updates, length=length)
    return {
        "wall_s": wall_s, "wait_s": wait_s, "compute_s": compute_s, "publish_s": publish_s,
        "other_s": max(wall_s - wait_s - compute_s - publish_s, 0.0), "timeline": timeline,
        "tokens_per_s": tokens / wall_s if wall_s > 0 else None,
        "padding_fraction": 1.0 - tokens / padded_tokens if padded_tokens > 0 else None,
        "device": devices.sample() if devices.due() else None,
    }


def rl_step_event(*, run_id: int, step: int, policy_version: int, records: Sequence[TrajectoryRecord],
                  metrics: dict[str, float], batch_stats: dict, profile: dict, rollout: dict) -> TrainerStepEvent:
    """The event of an RL step that trained on ``records``.

    ``metrics``: the update's mean scalars (non-finite ones are left out of the series);
    ``batch_stats``: the algorithm's statistics of the batch; ``profile``: :func:`profile_fields`;
    ``rollout``: the feed's fields of the step (:meth:`trainer.rollout_feed.RolloutFeed.step_fields`).
    """
    wall_s = profile["wall_s"]
    return TrainerStepEvent(
        run_id=run_id, step=step, phase="rl", policy_version=policy_version,
        loss=metrics["loss"], **profile,
        samples_per_s=len(records) / wall_s if wall_s > 0 else None,
        reward_mean=float(batch_stats["reward_mean"]),
        success_rate=float(np.mean([succeeded(record) for record in records])),
        failed_episodes=int(batch_stats.get("episodes_failed", 0)),
        **rollout,
        algorithm_metrics={
            **{name: value for name, value in metrics.items() if np.isfinite(value)},
            **{f"batch/{name}": float(value) for name, value in batch_stats.items()},
        },
        emitted_at=time.time(),
    )
