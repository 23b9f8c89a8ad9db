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


class WeightsConfig(BaseModel):
    """How the trainer publishes each new policy version to the producers."""

    model_config = ConfigDict(extra="forbid")

    transport: Literal["redis", "filesystem"] = Field(
        "redis",
        description=(
            "How new policy versions reach producers: through Redis (small models), or as Orbax "
            "checkpoints under weights.dir, a path every producer mounts (large models)."
        ),
    )
    dir: str | None = Field(
        None,
        description="Shared directory of the filesystem weight transport; default <trainer checkpoint dir>/weights.",
    )
