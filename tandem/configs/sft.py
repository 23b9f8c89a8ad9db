"""The SFT phase's data: which dataset versions, mixed with the environment's demonstrations by weight."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class SFTDatasetConfig(BaseModel):
    """One dataset of the project that the SFT phase trains on."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=100, description="A dataset of the run's project.")
    version: int | None = Field(
        None, ge=1, description="Its version; null: the latest, pinned when the run is created (a run "
        "stores the number, so a later upload never changes what it trains on)."
    )
    weight: float = Field(
        1.0, gt=0, le=1000, description="Its share of each SFT batch, relative to the other sources' weights."
    )


class SFTConfig(BaseModel):
    """Where the SFT phase's examples come from; ``sft_steps`` and ``sft_batch_size`` say how many."""

    model_config = ConfigDict(extra="forbid")

    datasets: list[SFTDatasetConfig] = Field(
        default_factory=list, max_length=16,
        description="Uploaded datasets (tandem datasets register) to train on, e.g. "
        '[{"name": "support-chats", "weight": 3}]. Empty: the environment\'s demonstrations only.',
    )
    demonstrations_weight: float | None = Field(
        None, ge=0, le=1000,
        description="Share of the environment's demonstrations in each batch, relative to the datasets' "
        "weights. null: 1 without datasets (they are the only source), 0 with datasets (datasets only).",
    )

    @model_validator(mode="after")
    def _each_dataset_once(self) -> SFTConfig:
        seen = set()
        for dataset in self.datasets:
            key = (dataset.name, dataset.version)
            if key in seen:
                raise ValueError(f"dataset {dataset.name!r} is listed twice; give it one weight")
            seen.add(key)
        return self

    @property
    def effective_demonstrations_weight(self) -> float:
        if self.demonstrations_weight is not None:
            return self.demonstrations_weight
        return 0.0 if self.datasets else 1.0
