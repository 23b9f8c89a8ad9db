"""How producers generate a run's episodes and how they reach the trainer (parts of RunConfig).

``sampling`` is what each policy turn draws from, ``rollout`` how many episodes
a step takes and how far generation may run ahead of training, ``stream`` what
happens to a trajectory entry nobody acknowledges.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SamplingConfig(BaseModel):
    """What producers sample each policy turn from, and how their inference engine batches turns."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(1.0, gt=0, le=10, description="Sampling temperature of producers.")
    top_p: float = Field(
        1.0,
        gt=0,
        le=1,
        description=(
            "Producers sample from the smallest set of most likely tokens whose probability reaches "
            "top_p; 1 disables it. Behaviour log-probs stay those of the untruncated tempered distribution."
        ),
    )
    top_k: int = Field(0, ge=0, le=1_000_000, description="Producers sample among the top_k most likely tokens; 0 disables it.")
    stop_strings: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list,
        max_length=16,
        description="A policy turn also ends right after the first of these strings (kept in the turn); EOS always ends it.",
    )
    max_new_tokens: int = Field(
        32, ge=1, le=4096,
        description="Tokens the policy may generate per turn (a native JSON tool call takes about 30).",
    )
    inference_slots: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="KV-cache rows of each producer process's inference engine (turns decoded together); "
        "default rollout.groups_per_task * rollout.group_size * the worker's task concurrency, at most 256.",
    )
    decode_chunk_tokens: int = Field(
        8,
        ge=1,
        le=256,
        description="Tokens every running turn decodes between two scheduling points: smaller lets new turns join sooner, larger amortises host overhead.",
    )
    refill_hold_fraction: float = Field(
        0.1,
        ge=0,
        le=0.5,
        description="The engine may hold a decode chunk, for at most this fraction of the last chunk's time, "
        "while the turns that the last chunk ended are followed by their next ones, when recent ones "
        "followed that soon (e.g. an agent program's next call): they then join this chunk rather than "
        "wait out the next. 0 never holds.",
    )


class RolloutConfig(BaseModel):
    """How many episodes an RL step takes, how far producers run ahead, and what bounds an episode."""

    model_config = ConfigDict(extra="forbid")

    groups_per_step: int = Field(4, ge=1, le=1024, description="Episode groups (tasks) per RL step.")
    group_size: int = Field(8, ge=2, le=256, description="Episodes per group; GRPO baselines within a group.")
    groups_per_task: int = Field(
        2, ge=1, le=256, description="Groups one Celery rollout task runs concurrently."
    )
    pipeline: Literal["async", "sync"] = Field(
        "async",
        description=(
            "async: producers generate ahead while the trainer trains (bounded by max_staleness). "
            "sync: the classic generate-then-train loop on the same code, the baseline for speed claims."
        ),
    )
    backlog_steps: int = Field(
        2,
        ge=1,
        le=64,
        description="RL steps' worth of episodes the trainer keeps requested ahead, so it never waits on generation.",
    )
    max_staleness: int | None = Field(
        2,
        ge=0,
        le=64,
        description=(
            "Policy versions a trajectory may lag the trainer: producers are never asked for more than "
            "(max_staleness + 1) steps of groups beyond those trained on (the step in training among them), "
            "so taken in order none arrives too stale; one that does all the same is dropped whole before "
            "the loss. None: no bound."
        ),
    )
    timeout_s: float = Field(
        900.0, gt=0, le=86_400,
        description=(
            "A requested episode group not consumed this long after its request is counted lost "
            "(a dead producer) and requested again; a rollout task still running this long (15 minutes "
            "at most) cancels its unfinished episodes."
        ),
    )
    max_turns: int = Field(3, ge=1, le=64, description="Agent turns before an episode is cut off.")
    environment_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="Timeout of each environment reset, step or tool call."
    )
    max_observation_chars: int = Field(
        8192, ge=1, le=10_000_000,
        description="Longest observation a reset, step or tool call may return; a longer one fails the episode.",
    )

    @model_validator(mode="after")
    def _one_task_fits_the_staleness_budget(self):
        if self.max_staleness is not None and self.groups_per_task > (self.max_staleness + 1) * self.groups_per_step:
            raise ValueError(
                "rollout.groups_per_task must be at most (rollout.max_staleness + 1) * rollout.groups_per_step, "
                "or no rollout task could ever be admitted"
            )
        return self

    @property
    def episodes_per_step(self) -> int:
        return self.groups_per_step * self.group_size


class StreamConfig(BaseModel):
    """What becomes of a trajectory entry on the run's stream that its reader never acknowledged."""

    model_config = ConfigDict(extra="forbid")

    reclaim_idle_ms: int = Field(
        60_000, ge=1_000, le=3_600_000,
        description="A trajectory entry another trainer left pending this long is taken over by the live trainer.",
    )
    max_deliveries: int = Field(
        5, ge=1, le=100,
        description="Deliveries after which a trajectory entry goes to the dead-letter stream instead of being retried.",
    )
