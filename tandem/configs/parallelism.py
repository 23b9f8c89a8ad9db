"""How a run spreads its training over devices and which parameters it trains.

Both are parts of :class:`tandem.configs.run.RunConfig`, so they are plain data
that the platform can store, show and diff. The defaults change nothing: LoRA
is off (every parameter is trained) and every device is a data-parallel
replica.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Block-relative names of the projections LoRA may adapt: ``blocks[i].<target>``.
LORA_TARGETS = (
    "attention.query",
    "attention.key",
    "attention.value",
    "attention.output",
    "mlp.gate",
    "mlp.up",
    "mlp.down",
)


class LoRAConfig(BaseModel):
    """Low-rank adapters (Hu et al., 2021) on chosen projections of every block.

    With LoRA enabled the trainer differentiates and updates only the
    adapters; base weights stay frozen. Producers still receive full weights
    (the subscriber folds the adapters into the base kernels).
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description="Train adapters instead of every parameter.")
    rank: int = Field(8, ge=1, le=1024, description="Inner dimension r of each adapter pair A [in, r], B [r, out].")
    alpha: float = Field(
        16.0, gt=0, description="Adapter output is scaled by alpha / rank, so changing rank keeps the update size."
    )
    targets: list[str] = Field(
        default_factory=lambda: ["attention.query", "attention.value"],
        min_length=1,
        description=f"Block-relative projections to adapt; any of {', '.join(LORA_TARGETS)}.",
    )

    @field_validator("targets")
    @classmethod
    def _known_targets(cls, targets: list[str]) -> list[str]:
        unknown = sorted(set(targets) - set(LORA_TARGETS))
        if unknown:
            raise ValueError(f"unknown LoRA targets {unknown}; choose from {list(LORA_TARGETS)}")
        if len(set(targets)) != len(targets):
            raise ValueError("LoRA targets must not repeat")
        return targets

    @property
    def scale(self) -> float:
        return self.alpha / self.rank


class MeshConfig(BaseModel):
    """Sizes of the device mesh axes; their product is the number of devices.

    ``data`` replicates parameters and splits the batch; ``fsdp`` splits the
    batch too and also shards parameters and optimizer state (gathered per
    layer in the step); ``tensor`` splits attention heads, MLP hidden units
    and the vocabulary (Megatron-style). One axis may be -1: it takes the
    devices the others leave.
    """

    model_config = ConfigDict(extra="forbid")

    data: int = Field(-1, description="Data-parallel replicas; -1 takes the remaining devices.")
    fsdp: int = Field(1, description="Fully sharded data-parallel ways; -1 takes the remaining devices.")
    tensor: int = Field(1, description="Tensor-parallel ways; -1 takes the remaining devices.")

    @model_validator(mode="after")
    def _sizes(self):
        sizes = (self.data, self.fsdp, self.tensor)
        if any(size == 0 or size < -1 for size in sizes):
            raise ValueError("mesh axis sizes must be positive, or -1 for the remaining devices")
        if sizes.count(-1) > 1:
            raise ValueError("at most one mesh axis may be -1")
        return self

    def axis_sizes(self, device_count: int) -> tuple[int, int, int]:
        """(data, fsdp, tensor) for ``device_count`` devices, with -1 resolved.

        Raises:
          ValueError: the sizes do not multiply to ``device_count``.
        """
        sizes = [self.data, self.fsdp, self.tensor]
        fixed = 1
        for size in sizes:
            if size != -1:
                fixed *= size
        if -1 in sizes:
            if device_count % fixed:
                raise ValueError(
                    f"mesh {self.data}x{self.fsdp}x{self.tensor} does not fit {device_count} devices"
                )
            sizes[sizes.index(-1)] = device_count // fixed
        if sizes[0] * sizes[1] * sizes[2] != device_count:
            raise ValueError(
                f"mesh data={sizes[0]} x fsdp={sizes[1]} x tensor={sizes[2]} needs "
                f"{sizes[0] * sizes[1] * sizes[2]} devices, there are {device_count}"
            )
        return sizes[0], sizes[1], sizes[2]
