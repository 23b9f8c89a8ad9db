"""Held-out evaluation during training (the ``evaluation`` part of RunConfig)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

#: Most episodes one evaluation may have: its report lists their trajectory ids, within a
#: request body the platform takes (about 2.5 MiB).
MAX_EVALUATION_EPISODES = 50_000


#: An environment of the run's project: ``name`` or ``name@version``.
EnvironmentReference = Annotated[str, StringConstraints(min_length=1, max_length=200, pattern=r"^[^@\s]+(@\d+)?$")]


class EvaluationDatasetConfig(BaseModel):
    """A dataset of the run's project whose held-out rows each evaluation measures the policy's loss on."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=100, description="A dataset of the run's project.")
    version: int | None = Field(
        None, ge=1, description="Its version; null: the latest, pinned when the run is created.")


class EvaluationConfig(BaseModel):
    """When the trainer asks producers to evaluate a published policy on held-out tasks, and how."""

    model_config = ConfigDict(extra="forbid")

    every_steps: int = Field(
        10, ge=1, le=1_000_000,
        description="RL steps between two evaluations; there is one before the first RL step and one at the end too.",
    )
    tasks: int = Field(32, ge=1, le=100_000, description="Held-out tasks per evaluation (the same ones every time).")
    samples_per_task: int = Field(
        4, ge=1, le=256, description="Episodes per task (n of pass@k); episodes per evaluation = tasks * samples_per_task."
    )
    temperature: float = Field(
        0.0, ge=0, le=10,
        description="Sampling temperature of evaluation episodes; 0 is greedy (every sample of a task is then the same).",
    )
    pass_k: list[int] = Field(
        [1], min_length=1, max_length=16,
        description="The k of pass@k (and avg@k) reported, each at most samples_per_task.",
    )
    tasks_per_request: int = Field(
        8, ge=1, le=10_000, description="Tasks one producer task runs, so that an evaluation spreads over producers."
    )
    environment: bool = Field(
        True, description="Evaluate on the run's environment's held-out tasks; false: only on environments and "
        "datasets named below.")
    environments: list[EnvironmentReference] = Field(
        default_factory=list, max_length=8,
        description="Other environments of the run's project to evaluate each published policy on, on their "
        "held-out tasks with the run's episode limits: 'name' (its latest version, pinned when the run is "
        "created) or 'name@version', e.g. [\"calculator-hard\"]. Each gets rows, metrics and series of its own.",
    )
    datasets: list[EvaluationDatasetConfig] = Field(
        default_factory=list, max_length=16,
        description="Datasets whose held-out rows (never trained on by SFT) each evaluation computes the "
        "policy's loss, perplexity and token accuracy on, in the trainer, e.g. [{\"name\": \"support-chats\"}].",
    )
    dataset_rows: int = Field(
        256, ge=1, le=100_000,
        description="Held-out rows of each dataset an evaluation scores (the first ones of its split, the "
        "same every time).",
    )
    timeout_s: float = Field(
        600.0, gt=0, le=86_400,
        description="How long the end of the run waits for its evaluations still out; what has not come back by "
        "then is reported incomplete, with how many episodes it has.",
    )

    @model_validator(mode="after")
    def _pass_k_within_samples(self) -> EvaluationConfig:
        too_large = [k for k in self.pass_k if not 1 <= k <= self.samples_per_task]
        if too_large:
            raise ValueError(f"pass_k {too_large} must be between 1 and samples_per_task ({self.samples_per_task})")
        self.pass_k = sorted(set(self.pass_k))
        if not self.environment and not self.environments and not self.datasets:
            raise ValueError("an evaluation needs the run's environment, another environment or a dataset")
        if len(set(self.environments)) != len(self.environments):
            raise ValueError("an environment is listed twice in environments")
        named = [(dataset.name, dataset.version) for dataset in self.datasets]
        if len(set(named)) != len(named):
            raise ValueError("a dataset version is listed twice in datasets")
        if self.episodes > MAX_EVALUATION_EPISODES:
            raise ValueError(f"tasks * samples_per_task is {self.episodes}, more than the "
                             f"{MAX_EVALUATION_EPISODES} episodes an evaluation may have")
        return self

    @property
    def episodes(self) -> int:
        return self.tasks * self.samples_per_task
