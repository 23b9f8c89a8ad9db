"""The one typed schema of a run's configuration.

The platform validates submitted configs against it (and publishes its JSON
schema), the trainer and producers read it. Every field documents itself and
has a default that makes the built-in demo learn on two CPU cores.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ModelConfig(BaseModel):
    """Shape of the decoder-only transformer policy."""

    model_config = ConfigDict(extra="forbid")

    d_model: int = Field(64, ge=8, le=8192, description="Width of the residual stream.")
    num_layers: int = Field(2, ge=1, le=128, description="Number of transformer blocks.")
    num_heads: int = Field(4, ge=1, le=128, description="Attention heads; must divide d_model.")
    mlp_dim: int = Field(256, ge=8, le=65536, description="Hidden width of each MLP.")
    max_seq_len: int = Field(128, ge=16, le=32768, description="Longest conversation in tokens.")

    @model_validator(mode="after")
    def _heads_divide_width(self):
        if self.d_model % self.num_heads:
            raise ValueError("num_heads must divide d_model")
        return self


class RunConfig(BaseModel):
    """Everything a run needs besides its environment."""

    model_config = ConfigDict(extra="forbid")

    algorithm: Literal["grpo"] = Field("grpo", description="Policy-gradient algorithm of the RL phase.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="Policy architecture.")
    seed: int = Field(0, description="Seeds parameter init, tasks and sampling.")
    learning_rate: float = Field(3e-3, gt=0, le=1.0, description="Adam learning rate of the SFT phase.")
    rl_learning_rate: float = Field(
        5e-4, gt=0, le=1.0, description="Adam learning rate of the RL phase; lower, as RL gradients are noisy."
    )
    sft_steps: int = Field(
        300, ge=0, le=100_000, description="Supervised steps on the environment's demonstrations before RL."
    )
    sft_batch_size: int = Field(32, ge=1, le=4096, description="Demonstrations per SFT step.")
    rl_steps: int = Field(40, ge=0, le=1_000_000, description="RL trainer steps; the run finishes after them.")
    groups_per_step: int = Field(4, ge=1, le=1024, description="Episode groups (tasks) per RL step.")
    group_size: int = Field(8, ge=2, le=256, description="Episodes per group; GRPO baselines within a group.")
    groups_per_task: int = Field(
        2, ge=1, le=256, description="Groups one Celery rollout task runs concurrently."
    )
    rollout_backlog_steps: int = Field(
        2,
        ge=1,
        le=64,
        description="RL steps' worth of episodes the trainer keeps requested ahead, so it never waits on generation.",
    )
    max_new_tokens: int = Field(24, ge=1, le=4096, description="Tokens the policy may generate per turn.")
    max_turns: int = Field(3, ge=1, le=64, description="Agent turns before an episode is cut off.")
    environment_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="Timeout of each environment reset, step or tool call."
    )
    temperature: float = Field(1.0, gt=0, le=10, description="Sampling temperature of producers.")
    clip_epsilon: float = Field(0.2, gt=0, le=1, description="PPO-style clip range of the GRPO ratio.")
    checkpoint_every: int = Field(20, ge=1, description="Trainer steps between Orbax checkpoints.")

    @property
    def episodes_per_step(self) -> int:
        return self.groups_per_step * self.group_size
