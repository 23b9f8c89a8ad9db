"""The one typed schema of a run's configuration.

The platform validates submitted configs against it (and publishes its JSON
schema), the trainer and producers read it. Every field documents itself and
has a default that makes the built-in demo learn on two CPU cores.

A config says its ``schema_version``. ``upgrade_run_config`` turns an older
one (version 1, the flat root, had none) into the current shape; the platform
applies it to every stored run it reads and to every config it is sent, so
runs stored, and client scripts written, before version 2 keep working.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tandem.configs.algorithm import AlgorithmConfig
from tandem.configs.evaluation import EvaluationConfig
from tandem.configs.memory import TrainerMemoryConfig
from tandem.configs.model import ModelConfig
from tandem.configs.optimizer import OptimizerConfig, ScheduleConfig
from tandem.configs.parallelism import LoRAConfig, MeshConfig
from tandem.configs.rollout import RolloutConfig, SamplingConfig, StreamConfig
from tandem.configs.sft import SFTConfig
from tandem.configs.weights import CheckpointConfig, StartFromConfig, WeightsConfig

# Version 1 was the flat root (no schema_version); 2 groups it into sections.
# A stored or submitted config of an older version goes through
# upgrade_run_config before it is validated.
RUN_CONFIG_SCHEMA_VERSION = 2


class RunConfig(BaseModel):
    """Everything a run needs besides its environment."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[2] = Field(
        RUN_CONFIG_SCHEMA_VERSION,
        description="Shape of this config. A config without it is read as version 1 (the flat shape "
        "before sections) and upgraded.",
    )
    lora: LoRAConfig = Field(
        default_factory=LoRAConfig, description="Low-rank adapters; when enabled only adapters train and publish."
    )
    mesh: MeshConfig = Field(
        default_factory=MeshConfig, description="How the trainer shards over its devices (data, fsdp, tensor)."
    )
    algorithm: AlgorithmConfig = Field(
        default_factory=AlgorithmConfig,
        description="Post-training algorithm of the RL phase (grpo, dr_grpo, dapo, rloo, ppo, or sft only).",
    )
    model: ModelConfig = Field(default_factory=ModelConfig, description="Policy architecture.")
    memory: TrainerMemoryConfig = Field(
        default_factory=TrainerMemoryConfig,
        description="The trainer's activation memory: micro-batches of a token budget with gradient "
        "accumulation, how many tokens' logits exist at once, and remat per transformer block.",
    )
    seed: int = Field(0, description="Seeds parameter init, tasks and sampling.")
    optimizer: OptimizerConfig = Field(
        default_factory=OptimizerConfig, description="Adam or AdamW after gradient clipping, for both phases."
    )
    schedule: ScheduleConfig = Field(
        default_factory=ScheduleConfig, description="Warm-up and decay of the learning rate within each phase."
    )
    learning_rate: float = Field(3e-3, gt=0, le=1.0, description="Peak learning rate of the SFT phase.")
    rl_learning_rate: float = Field(
        5e-4, gt=0, le=1.0, description="Peak learning rate of the RL phase; lower, as RL gradients are noisy."
    )
    sft_steps: int = Field(
        300, ge=0, le=100_000, description="Supervised steps on the environment's demonstrations before RL."
    )
    sft_batch_size: int = Field(32, ge=1, le=4096, description="Demonstrations per SFT step.")
    sft: SFTConfig = Field(
        default_factory=SFTConfig,
        description="The SFT phase's data: uploaded datasets and the environment's demonstrations, by weight. "
        "A run with sft_steps > 0 needs one of them (the platform refuses it otherwise).",
    )
    rl_steps: int = Field(40, ge=0, le=1_000_000, description="RL trainer steps; the run finishes after them.")
    evaluation: EvaluationConfig | None = Field(
        None,
        description="Held-out evaluation of published policies on producers, beside training: every_steps, "
        "tasks and samples per task, temperature (0: greedy), pass_k. null: no evaluation.",
    )
    trajectory_samples_per_step: int = Field(
        2, ge=0, le=64,
        description="Trajectories of each RL step the trainer sends to the platform's trajectory browser: "
        "the best and worst rewards (half each), plus up to as many failed episodes. 0: none.",
    )
    trajectory_sample_groups_per_step: int = Field(
        1, ge=0, le=8,
        description="Whole groups of each RL step the trainer also sends to the trajectory browser, every "
        "episode (failed ones too) with its advantage: the groups with the widest reward range first. 0: none.",
    )
    sampling: SamplingConfig = Field(
        default_factory=SamplingConfig,
        description="What producers sample each policy turn from (temperature, top-p/k, stop strings, "
        "tokens per turn) and how their inference engine batches turns.",
    )
    rollout: RolloutConfig = Field(
        default_factory=RolloutConfig,
        description="Episodes per RL step, how far producers generate ahead (pipeline, backlog, staleness), "
        "and the limits of one episode.",
    )
    stream: StreamConfig = Field(
        default_factory=StreamConfig,
        description="Unacknowledged trajectory entries: when the live trainer takes them over, when they are dead letters.",
    )
    checkpoint: CheckpointConfig = Field(
        default_factory=CheckpointConfig, description="How often the trainer commits Orbax checkpoints and how many it keeps."
    )
    weights: WeightsConfig = Field(
        default_factory=WeightsConfig, description="How new policy versions reach the producers."
    )
    start_from: StartFromConfig | None = Field(
        None,
        description="A kept checkpoint of another run of the project to start from (its whole train state: "
        "the model and optimizer sections must match that run's). Set by POST /api/runs/<id>/evaluate/ "
        "(tandem eval create) for evaluation-only runs; never given directly.",
    )
    max_restarts: int = Field(
        3, ge=0, le=100,
        description="Times the platform queues the run again on its own when its trainer dies (stops sending "
        "heartbeats), a multi-process trainer loses one of its processes, or its trainer sets it aside (the "
        "platform kept failing a read of its data: other runs are trained meanwhile); the next trainer "
        "resumes it from its last checkpoint. Past them, the run fails.",
    )
    stall_timeout_s: float = Field(
        1800.0, ge=10, le=7 * 86400,
        description="A running run whose trainer step has not advanced for this long is flagged as stalled "
        "on its page and in the API (its trainer may be alive but stuck); it keeps running.",
    )


# Where each key of the version-1 (flat) root went in version 2: (section, name).
_VERSION_1_MOVES: dict[str, tuple[str, str]] = {
    **{name: ("sampling", name) for name in (
        "temperature", "top_p", "top_k", "stop_strings", "max_new_tokens", "inference_slots",
        "decode_chunk_tokens",
    )},
    **{name: ("rollout", name) for name in (
        "groups_per_step", "group_size", "groups_per_task", "pipeline", "max_staleness", "max_turns",
        "environment_timeout_s", "max_observation_chars",
    )},
    "rollout_backlog_steps": ("rollout", "backlog_steps"),
    "rollout_timeout_s": ("rollout", "timeout_s"),
    "reclaim_idle_ms": ("stream", "reclaim_idle_ms"),
    "max_deliveries": ("stream", "max_deliveries"),
    "checkpoint_every": ("checkpoint", "every"),
    "checkpoints_kept": ("checkpoint", "kept"),
    "weight_transport": ("weights", "transport"),
    "weight_dir": ("weights", "dir"),
}


def upgrade_run_config(data: dict[str, Any]) -> dict[str, Any]:
    """``data``, a full or partial config of any version, in the current shape (a new dict).

    Without ``schema_version`` a config is version 1, the flat root: each of its
    old keys moves to its section under its new name, merged into a section
    already given. A partial config of the current shape sent without a
    version keeps its keys as they are (no version-1 key is a version-2 one)
    and gains the version. A key
    that would overwrite one already in its section stays where it is, and so
    does any key this function does not know, so that validation names it. A
    config of version 2, or of a version this reader does not know, is
    returned unchanged, for validation to accept or refuse.
    """
    version = data.get("schema_version", 1)
    if version != 1:
        return dict(data)
    upgraded: dict[str, Any] = {}
    moved: list[tuple[str, str, str, Any]] = []
    for key, value in data.items():
        if key in _VERSION_1_MOVES:
            moved.append((key, *_VERSION_1_MOVES[key], value))
        elif key != "schema_version":
            upgraded[key] = value
    for key, section, name, value in moved:
        target = upgraded.setdefault(section, {})
        if isinstance(target, dict) and name not in target:
            upgraded[section] = {**target, name: value}
        else:
            upgraded[key] = value
    upgraded["schema_version"] = RUN_CONFIG_SCHEMA_VERSION
    return upgraded


def resolve_schema_ref(root: dict, node: dict) -> dict:
    """``node`` of RunConfig's JSON schema ``root``, or the definition its ``$ref`` points to.

    For the schema's readers: the new-run form (platform/runs/config_form.py) and
    the reference it is documented by (tandem/configs/docs.py).
    """
    ref = node.get("$ref")
    if not ref:
        return node
    target = root
    for part in ref.removeprefix("#/").split("/"):
        target = target[part]
    return target
