"""The one typed schema of a run's configuration.

The platform validates submitted configs against it (and publishes its JSON
schema), the trainer and producers read it. Every field documents itself and
has a default that makes the built-in demo learn on two CPU cores.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tandem.algorithm_config import AlgorithmConfig
from tandem.optimizer_config import OptimizerConfig, ScheduleConfig
from tandem.parallelism_config import LoRAConfig, MeshConfig


class ModelConfig(BaseModel):
    """Shape of the decoder-only transformer policy.

    The defaults are the nano model trained from scratch with the byte
    tokenizer. With ``hf_checkpoint`` set, the architecture comes from the
    checkpoint's config.json instead and only ``max_seq_len`` and
    ``param_dtype`` of this config apply.
    """

    model_config = ConfigDict(extra="forbid")

    d_model: int = Field(64, ge=8, le=8192, description="Width of the residual stream.")
    num_layers: int = Field(2, ge=1, le=128, description="Number of transformer blocks.")
    num_heads: int = Field(
        4, ge=1, le=128, description="Query heads; must divide d_model unless head_dim is set."
    )
    mlp_dim: int = Field(256, ge=8, le=65536, description="Hidden width of each MLP.")
    max_seq_len: int = Field(128, ge=16, le=32768, description="Longest conversation in tokens.")
    num_kv_heads: int | None = Field(
        None,
        ge=1,
        le=128,
        description="Key/value heads (grouped-query attention); must divide num_heads. None: num_heads.",
    )
    head_dim: int | None = Field(
        None,
        ge=2,
        le=1024,
        description="Width of each attention head (even). None: d_model / num_heads.",
    )
    rope_theta: float = Field(
        10_000.0, gt=0, description="Base wavelength of the rotary position embedding."
    )
    rope_scaling: dict[str, float | str] | None = Field(
        None,
        description=(
            "Llama-3 rotary scaling, as in Hugging Face: {rope_type: 'llama3', factor, "
            "low_freq_factor, high_freq_factor, original_max_position_embeddings}. None: plain RoPE."
        ),
    )
    rms_norm_eps: float = Field(1e-6, gt=0, le=0.1, description="Epsilon of every RMSNorm.")
    qkv_bias: bool = Field(False, description="Biases on the query/key/value projections (Qwen2).")
    qk_norm: bool = Field(
        False, description="RMSNorm on each query and key head before the rotary embedding (Qwen3)."
    )
    tie_embeddings: bool = Field(
        False, description="The output head shares the token embedding matrix."
    )
    param_dtype: Literal["float32", "bfloat16"] = Field(
        "float32", description="Dtype of the parameters and matmuls; logits are float32 either way."
    )
    tokenizer: str = Field(
        "byte",
        description=(
            "'byte' (the byte-level default), or a local directory holding tokenizer.json "
            "(usually the hf_checkpoint directory)."
        ),
    )
    hf_checkpoint: str | None = Field(
        None,
        description=(
            "Local directory of a Hugging Face Llama/Qwen2/Qwen3 checkpoint (config.json and "
            "*.safetensors) to initialize the policy from; its config.json sets the architecture."
        ),
    )

    @model_validator(mode="after")
    def _heads_divide_width(self):
        if self.head_dim is None and self.d_model % self.num_heads:
            raise ValueError("num_heads must divide d_model (or set head_dim)")
        if self.head_dim is not None and self.head_dim % 2:
            raise ValueError("head_dim must be even (rotary embeddings)")
        if self.num_kv_heads is not None and self.num_heads % self.num_kv_heads:
            raise ValueError("num_kv_heads must divide num_heads")
        return self

    @model_validator(mode="after")
    def _rope_scaling_is_llama3(self):
        if self.rope_scaling is None:
            return self
        if self.rope_scaling.get("rope_type", "llama3") != "llama3":
            raise ValueError("rope_scaling.rope_type must be 'llama3', the only one implemented")
        numbers = {"factor", "low_freq_factor", "high_freq_factor"}
        required = numbers | {"original_max_position_embeddings"}
        unknown = set(self.rope_scaling) - required - {"rope_type"}
        if unknown:
            raise ValueError(f"rope_scaling has unknown keys {sorted(unknown)}")
        if required - set(self.rope_scaling):
            raise ValueError(f"rope_scaling lacks keys {sorted(required - set(self.rope_scaling))}")
        if any(isinstance(self.rope_scaling[key], str) for key in required):
            raise ValueError(f"rope_scaling values {sorted(required)} must be numbers")
        return self


class RunConfig(BaseModel):
    """Everything a run needs besides its environment."""

    model_config = ConfigDict(extra="forbid")

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
    rl_steps: int = Field(40, ge=0, le=1_000_000, description="RL trainer steps; the run finishes after them.")
    groups_per_step: int = Field(4, ge=1, le=1024, description="Episode groups (tasks) per RL step.")
    group_size: int = Field(8, ge=2, le=256, description="Episodes per group; GRPO baselines within a group.")
    groups_per_task: int = Field(
        2, ge=1, le=256, description="Groups one Celery rollout task runs concurrently."
    )
    weight_transport: Literal["redis", "filesystem"] = Field(
        "redis",
        description=(
            "How new policy versions reach producers: through Redis (small models), or as Orbax "
            "checkpoints under weight_dir, a path every producer mounts (large models)."
        ),
    )
    weight_dir: str | None = Field(
        None,
        description="Shared directory of the filesystem weight transport; default <trainer checkpoint dir>/weights.",
    )
    pipeline: Literal["async", "sync"] = Field(
        "async",
        description=(
            "async: producers generate ahead while the trainer trains (bounded by max_staleness). "
            "sync: the classic generate-then-train loop on the same code, the baseline for speed claims."
        ),
    )
    rollout_backlog_steps: int = Field(
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
            "Policy versions a trajectory may lag the trainer: older groups are dropped whole before the "
            "loss, and producers are never asked for more than (max_staleness + 1) steps of groups. "
            "None: no bound."
        ),
    )
    rollout_timeout_s: float = Field(
        900.0, gt=0, le=86_400,
        description=(
            "A requested episode group not consumed this long after its request is counted lost "
            "(a dead producer) and requested again; a rollout task still running this long (15 minutes "
            "at most) cancels its unfinished episodes."
        ),
    )
    reclaim_idle_ms: int = Field(
        60_000, ge=1_000, le=3_600_000,
        description="A trajectory entry another trainer left pending this long is taken over by the live trainer.",
    )
    max_deliveries: int = Field(
        5, ge=1, le=100,
        description="Deliveries after which a trajectory entry goes to the dead-letter stream instead of being retried.",
    )
    max_new_tokens: int = Field(24, ge=1, le=4096, description="Tokens the policy may generate per turn.")
    max_turns: int = Field(3, ge=1, le=64, description="Agent turns before an episode is cut off.")
    environment_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="Timeout of each environment reset, step or tool call."
    )
    max_observation_chars: int = Field(
        8192, ge=1, le=10_000_000,
        description="Longest observation a reset, step or tool call may return; a longer one fails the episode.",
    )
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
    inference_slots: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="KV-cache rows of each producer process's inference engine (turns decoded together); "
        "default groups_per_task * group_size * the worker's task concurrency, at most 256.",
    )
    decode_chunk_tokens: int = Field(
        8,
        ge=1,
        le=256,
        description="Tokens every running turn decodes between two scheduling points: smaller lets new turns join sooner, larger amortises host overhead.",
    )
    temperature: float = Field(1.0, gt=0, le=10, description="Sampling temperature of producers.")
    checkpoint_every: int = Field(20, ge=1, description="Trainer steps between Orbax checkpoints.")
    checkpoints_kept: int = Field(
        3, ge=1, le=1000,
        description="Retention policy: the newest this many Orbax checkpoints of the run are kept on disk; "
        "older ones are deleted as new ones are committed (the platform marks them deleted by retention).",
    )
    trajectory_samples_per_step: int = Field(
        2, ge=0, le=64,
        description="Trajectories of each RL step the trainer sends to the platform's trajectory browser: "
        "the best and worst rewards (half each), plus up to as many failed episodes. 0: none.",
    )

    @model_validator(mode="after")
    def _one_task_fits_the_staleness_budget(self):
        if self.max_staleness is not None and self.groups_per_task > (self.max_staleness + 1) * self.groups_per_step:
            raise ValueError(
                "groups_per_task must be at most (max_staleness + 1) * groups_per_step, "
                "or no rollout task could ever be admitted"
            )
        return self

    @property
    def episodes_per_step(self) -> int:
        return self.groups_per_step * self.group_size


def resolve_schema_ref(root: dict, node: dict) -> dict:
    """``node`` of RunConfig's JSON schema ``root``, or the definition its ``$ref`` points to.

    For the schema's readers: the new-run form (platform/runs/config_form.py) and
    the reference it is documented by (tandem/run_config_docs.py).
    """
    ref = node.get("$ref")
    if not ref:
        return node
    target = root
    for part in ref.removeprefix("#/").split("/"):
        target = target[part]
    return target
