"""Payloads as other processes send them."""

from __future__ import annotations

import time

from tandem.contracts import TrainerStepEvent


def step_event(run_id: int, step: int, **overrides) -> dict:
    """A TrainerStepEvent as the trainer posts it (JSON), with 11 metric values."""
    event = {
        "run_id": run_id,
        "step": step,
        "phase": "rl",
        "policy_version": step,
        "wall_s": 1.0,
        "wait_s": 0.25,
        "compute_s": 0.5,
        "publish_s": 0.1,
        "other_s": 0.15,
        "loss": 1.0 / (step + 1),
        "reward_mean": 0.1 * step,
        "success_rate": 0.05 * step,
        "emitted_at": time.time(),
    }
    event.update(overrides)
    return TrainerStepEvent.model_validate(event).model_dump(mode="json")


POINTS_PER_STEP_EVENT = len(TrainerStepEvent.model_validate(step_event(1, 1)).metric_values())
