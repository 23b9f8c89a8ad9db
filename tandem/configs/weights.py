"""Where a run's trained weights go (parts of RunConfig).

``checkpoint``: the Orbax checkpoints the trainer commits and resumes from;
``weights``: how each new policy version reaches the producers.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class CheckpointConfig(BaseModel):
    """How often the trainer commits an Orbax checkpoint, and how many it keeps."""

    model_config = ConfigDict(extra="forbid")

    every: int = Field(20, ge=1, description="Trainer steps between Orbax checkpoints.")
    kept: int = Field(
        3, ge=1, le=1000,
        description="Retention policy: the newest this many Orbax checkpoints of the run are kept on disk; "
        "older ones are deleted as new ones are committed (the platform marks them deleted by retention).",
    )


class StartFromConfig(BaseModel):
    """A kept checkpoint of another run of the project that a run starts from, instead of initialising."""

    model_config = ConfigDict(extra="forbid")

    run: int = Field(ge=1, description="The run whose checkpoint it is.")
    step: int = Field(ge=0, description="Its step (the platform pins it when the run is created).")


#: How new policy versions reach the producers (policy.weight_publisher builds each).
WeightTransport = Literal["auto", "redis", "filesystem"]
#: The dtype floating parameters travel in.
PublishDtype = Literal["as_trained", "bfloat16"]


class WeightsConfig(BaseModel):
    """How the trainer publishes each new policy version to the producers."""

    model_config = ConfigDict(extra="forbid")

    transport: WeightTransport = Field(
        "auto",
        description=(
            "How new policy versions reach producers. redis: through Redis, in chunks of at most 64 MiB "
            "(a run whose publication exceeds weights.redis_max_mb fails before anything is sent). "
            "filesystem: as Orbax checkpoints under the operator's TANDEM_WEIGHT_DIR, a path every producer mounts. "
            "auto: redis up to weights.redis_max_mb, filesystem above."
        ),
    )
    dir: str | None = Field(
        None,
        description=(
            "Not for runs: the filesystem weight transport's directory is the operator's "
            "TANDEM_WEIGHT_DIR on the trainer (default <trainer checkpoint dir>/weights); the "
            "platform refuses a run that sets it."
        ),
    )
    redis_max_mb: int = Field(
        4096, ge=1, le=1_048_576,
        description=(
            "Largest publication (MiB, at weights.publish_dtype) sent through Redis: Redis holds a run's "
            "newest version in memory, and during a publish the previous one too."
        ),
    )
    publish_dtype: PublishDtype = Field(
        "as_trained",
        description=(
            "Floating parameters as trained (float32 for most runs), or cast to bfloat16 for the redis "
            "transport: half the bytes; producers cast them back to their model's dtype."
        ),
    )
