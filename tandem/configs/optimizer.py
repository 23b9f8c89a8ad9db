"""The optimizer and the learning-rate schedule of a run (part of RunConfig)."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class OptimizerConfig(BaseModel):
    """Adam or AdamW, after clipping the gradients' global norm; the same for SFT and RL."""

    model_config = ConfigDict(extra="forbid")

    name: Literal["adam", "adamw"] = Field(
        "adam", description="adam, or adamw: Adam with decoupled weight decay."
    )
    b1: float = Field(0.9, gt=0, lt=1, description="Decay rate of the first-moment (mean) estimate.")
    b2: float = Field(0.999, gt=0, lt=1, description="Decay rate of the second-moment (variance) estimate.")
    eps: float = Field(1e-8, gt=0, le=1e-2, description="Added to the root of the second moment, for stability.")
    weight_decay: float = Field(
        0.0, ge=0, le=1, description="Decoupled weight decay per step, times the learning rate (adamw only)."
    )
    max_grad_norm: float = Field(
        1.0, gt=0, le=1e6, description="Gradients are scaled down to this global norm before the update."
    )

    @model_validator(mode="after")
    def _decay_needs_adamw(self):
        if self.weight_decay and self.name != "adamw":
            raise ValueError("weight_decay needs name 'adamw' (Adam's L2 penalty is not decoupled)")
        return self


class ScheduleConfig(BaseModel):
    """How the learning rate moves within each phase, from that phase's own rate.

    SFT runs from ``learning_rate`` over ``sft_steps``, RL from
    ``rl_learning_rate`` over ``rl_steps``; each phase warms up and decays on
    its own. The rate of a step depends only on its index, so a run resumed
    from a checkpoint follows the same schedule.
    """

    model_config = ConfigDict(extra="forbid")

    warmup_steps: int = Field(
        0, ge=0, le=1_000_000, description="First steps of each phase, whose rate rises linearly to the phase's rate."
    )
    decay: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="After warm-up: stay (constant), or fall linearly or along a half cosine."
    )
    min_ratio: float = Field(
        0.0, ge=0, le=1, description="The decayed rate's floor at a phase's last step, as a fraction of its rate."
    )

    def learning_rate_at(self, *, base: float, step: int, total_steps: int) -> float:
        """The rate of a phase's ``step`` (0-based) out of ``total_steps``, starting from ``base``."""
        if step < self.warmup_steps:
            return base * (step + 1) / self.warmup_steps
        decay_steps = total_steps - self.warmup_steps
        if self.decay == "constant" or decay_steps <= 1:
            return base
        progress = min((step - self.warmup_steps) / (decay_steps - 1), 1.0)
        remaining = 1.0 - progress if self.decay == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
        return base * (self.min_ratio + (1.0 - self.min_ratio) * remaining)
