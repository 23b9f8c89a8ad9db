"""The trainer's step events: built from what a step did, and posted to the platform in batches."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from tandem.contracts import (
    IDLE_STAGE,
    StepTimeline,
    TraceRequest,
    TrainerStepEvent,
    TrajectoryRecord,
)
from trainer.devices import DeviceMonitor
from trainer.platform_client import PlatformClient
from trainer.profiling import timeline_wall_s
from trainer.trajectory_samples import TrajectorySampleBuffer


@dataclass
class StepEventBatcher:
    """Posts step events every ``interval_s``, so a fast SFT phase does not make one request per step."""

    platform: PlatformClient
    run_id: int
    interval_s: float
    # Receives the pending trace requests the platform returns with each post.
    on_trace_requests: Callable[[list[TraceRequest]], None] = lambda requests: None
    pending: list[TrainerStepEvent] = field(default_factory=list)
    last_flush: float = 0.0
    # Sampled trajectories go out with the events (the trajectory browser's data).
    trajectories: TrajectorySampleBuffer | None = None

    def emit(self, event: TrainerStepEvent) -> None:
        self.pending.append(event)
        if time.monotonic() - self.last_flush >= self.interval_s:
            self.flush()

    def flush(self) -> None:
        events, self.pending = self.pending, []
        if events:
            self.on_trace_requests(self.platform.post_events(self.run_id, events).trace_requests)
        if self.trajectories is not None:
            self.trajectories.flush()
        self.last_flush = time.monotonic()


def profile_fields(timeline: StepTimeline, *, tokens: int, updates: int = 1, devices: DeviceMonitor) -> dict:
    """A step event's stage fields and tokens/s, from its timeline, and a device report when one is due.

    ``tokens``: the step's batch tokens. ``updates``: optimizer updates run on that batch; each
    costs the model FLOPs of its tokens, but tokens/s counts the batch's tokens once, as
    samples/s counts its samples.
    """
    seconds = timeline.seconds_by_stage()
    wall_s = timeline_wall_s(timeline)
    wait_s, compute_s, publish_s = (seconds.get(name, 0.0) for name in (IDLE_STAGE, "compute", "publish"))
    devices.observe(timeline, tokens=tokens * updates)
    return {
        "wall_s": wall_s, "wait_s": wait_s, "compute_s": compute_s, "publish_s": publish_s,
        "other_s": max(wall_s - wait_s - compute_s - publish_s, 0.0), "timeline": timeline,
        "tokens_per_s": tokens / wall_s if wall_s > 0 else None,
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
        success_rate=float(np.mean([r.status != "failed" and r.reward > 0 for r in records])),
        failed_episodes=int(batch_stats.get("episodes_failed", 0)),
        **rollout,
        algorithm_metrics={
            **{name: value for name, value in metrics.items() if np.isfinite(value)},
            **{f"batch/{name}": float(value) for name, value in batch_stats.items()},
        },
        emitted_at=time.time(),
    )
