"""The operator's caps on what one run may ask of the shared trainer and workers, and a run's footprint.

Any member can queue a run, and the trainer and every rollout worker then
build what its config says: a model of ``d_model`` 8192 and 128 layers, or
4,096 inference slots, runs them out of memory, and a redelivered rollout task
crash-loops every worker. So the platform checks a config against the caps
when it is written (a 400 naming the cap's setting):

- ``TANDEM_MAX_PARAMETERS``: parameters of the policy (default 4e9);
- ``TANDEM_MAX_KV_CACHE_BYTES``: one worker engine's KV cache (default 16 GiB);
- ``TANDEM_MAX_EPISODES_PER_STEP``: ``groups_per_step * group_size`` (default 4096);
- ``TANDEM_MAX_ACTIVE_RUNS_PER_PROJECT``: queued, running and paused runs of a project (default 8);
- ``TANDEM_TRAINER_MEMORY_BYTES``: the memory of the trainer, which a run's memory plan must fit
  (tandem/configs/memory_plan.py; default: the device memory that live trainers on accelerators report,
  unchecked on CPU).

The footprint is computed from the config alone (and the checkpoint's
``config.json`` when the platform can read it): no JAX, no weights.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from tandem.configs.model import BYTE_VOCAB_SIZE

#: Inference slots of a worker engine when a run does not set them (workers/policy.py).
DEFAULT_SLOTS_CAP = 256
#: Bytes of one parameter (or cache entry) of each model.param_dtype.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}


@dataclasses.dataclass(frozen=True)
class RunQuotas:
    """The operator's caps; each field names the environment variable that sets it."""

    # TANDEM_MAX_PARAMETERS: parameters of the policy.
    max_parameters: int = 4_000_000_000
    # TANDEM_MAX_KV_CACHE_BYTES: bytes of one rollout worker engine's KV cache.
    max_kv_cache_bytes: int = 16 * 2**30
    # TANDEM_MAX_EPISODES_PER_STEP: episodes one RL step trains on.
    max_episodes_per_step: int = 4096
    # TANDEM_MAX_ACTIVE_RUNS_PER_PROJECT: queued, running and paused runs of one project.
    max_active_runs_per_project: int = 8
    # TANDEM_WORKER_CONCURRENCY: task threads per worker, which share one engine's slots.
    worker_concurrency: int = 4
    # TANDEM_TRAINER_MEMORY_BYTES: the trainer's memory (its device's, or its host's on CPU); None: unchecked.
    trainer_memory_bytes: int | None = None

    @classmethod
    def from_environment(cls) -> RunQuotas:
        values = {}
        for field in dataclasses.fields(cls):
            variable = QUOTA_SETTINGS[field.name]
            if os.environ.get(variable):
                values[field.name] = int(float(os.environ[variable]))
        return cls(**values)


QUOTA_SETTINGS = {
    "max_parameters": "TANDEM_MAX_PARAMETERS",
    "max_kv_cache_bytes": "TANDEM_MAX_KV_CACHE_BYTES",
    "max_episodes_per_step": "TANDEM_MAX_EPISODES_PER_STEP",
    "max_active_runs_per_project": "TANDEM_MAX_ACTIVE_RUNS_PER_PROJECT",
    "worker_concurrency": "TANDEM_WORKER_CONCURRENCY",
    "trainer_memory_bytes": "TANDEM_TRAINER_MEMORY_BYTES",
}


class QuotaExceeded(ValueError):
    """A config asks for more than a cap allows; ``field`` is the config field to change."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclasses.dataclass(frozen=True)
class Architecture:
    vocab_size: int
    d_model: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_dim: int
    tie_embeddings: bool
    qkv_bias: bool
    # RMSNorm over each query and key head (Qwen3, Gemma 3).
    qk_norm: bool = False
    # A norm after each sublayer as well as before it (Gemma 3).
    post_sublayer_norms: bool = False


# Architectures (config.json's ``architectures``) with QK-norm and with norms after their sublayers.
_QK_NORM_ARCHITECTURES = {"Qwen3ForCausalLM", "Gemma3ForCausalLM"}
_POST_SUBLAYER_NORM_ARCHITECTURES = {"Gemma3ForCausalLM"}


def architecture(model: dict[str, Any]) -> Architecture:
    """The architecture a run's ``model`` config (as JSON) builds: its checkpoint's when readable."""
    source = dict(model)
    vocab_size = BYTE_VOCAB_SIZE
    checkpoint = model.get("hf_checkpoint")
    config_file = Path(checkpoint) / "config.json" if checkpoint else None
    if config_file is not None and config_file.is_file():
        hf = json.loads(config_file.read_text())
        named = set(hf.get("architectures") or [])
        source.update(
            qk_norm=bool(named & _QK_NORM_ARCHITECTURES),
            post_sublayer_norms=bool(named & _POST_SUBLAYER_NORM_ARCHITECTURES),
            d_model=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
            num_heads=hf["num_attention_heads"],
            num_kv_heads=hf.get("num_key_value_heads") or hf["num_attention_heads"],
            head_dim=hf.get("head_dim"), mlp_dim=hf["intermediate_size"],
            tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=bool(hf.get("attention_bias", False)),
        )
        vocab_size = int(hf["vocab_size"])
    num_heads = int(source["num_heads"])
    head_dim = int(source.get("head_dim") or int(source["d_model"]) // num_heads)
    return Architecture(
        vocab_size=vocab_size, d_model=int(source["d_model"]), num_layers=int(source["num_layers"]),
        num_heads=num_heads, num_kv_heads=int(source.get("num_kv_heads") or num_heads),
        head_dim=head_dim, mlp_dim=int(source["mlp_dim"]),
        tie_embeddings=bool(source.get("tie_embeddings")), qkv_bias=bool(source.get("qkv_bias")),
        qk_norm=bool(source.get("qk_norm")), post_sublayer_norms=bool(source.get("post_sublayer_norms")),
    )


def parameter_count(arch: Architecture) -> int:
    """Parameters of the policy (policy/model.py's Transformer), norms included."""
    query, kv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    attention = arch.d_model * query + 2 * arch.d_model * kv + query * arch.d_model
    if arch.qkv_bias:
        attention += query + 2 * kv
    if arch.qk_norm:
        attention += 2 * arch.head_dim
    norms = (4 if arch.post_sublayer_norms else 2) * arch.d_model
    block = attention + 3 * arch.d_model * arch.mlp_dim + norms
    embedding = arch.vocab_size * arch.d_model
    head = 0 if arch.tie_embeddings else arch.vocab_size * arch.d_model
    return embedding + arch.num_layers * block + arch.d_model + head


def slot_count(*, configured: int | None, groups_per_task: int, group_size: int,
               task_concurrency: int) -> int:
    """KV-cache rows of a worker's engine: the run's ``sampling.inference_slots``, else every
    episode the worker's task threads run at once, at most DEFAULT_SLOTS_CAP (a default, not a
    limit). The one rule for workers (workers/policy.py) and for the KV-cache cap here."""
    return configured or min(groups_per_task * group_size * task_concurrency, DEFAULT_SLOTS_CAP)


def inference_slots(config: dict[str, Any], worker_concurrency: int) -> int:
    """KV-cache rows of a worker's engine for the run, from its config as JSON."""
    rollout = config["rollout"]
    return slot_count(configured=config["sampling"].get("inference_slots"),
                      groups_per_task=rollout["groups_per_task"], group_size=rollout["group_size"],
                      task_concurrency=worker_concurrency)


def kv_cache_bytes(config: dict[str, Any], arch: Architecture, worker_concurrency: int) -> int:
    """Bytes of one worker engine's KV cache: keys and values of every slot, layer and position."""
    model = config["model"]
    per_slot = 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * (model["max_seq_len"] + 1)
    return inference_slots(config, worker_concurrency) * per_slot * DTYPE_BYTES[model["param_dtype"]]


def check_run_quotas(config: dict[str, Any], quotas: RunQuotas) -> None:
    """Raise QuotaExceeded naming the config field and the cap's setting, if ``config`` (normalised JSON) exceeds one."""
    arch = architecture(config["model"])
    parameters = parameter_count(arch)
    if parameters > quotas.max_parameters:
        raise QuotaExceeded("config.model", (
            f"the policy has {parameters:,} parameters; this deployment allows at most "
            f"{quotas.max_parameters:,} (TANDEM_MAX_PARAMETERS)"))
    cache = kv_cache_bytes(config, arch, quotas.worker_concurrency)
    if cache > quotas.max_kv_cache_bytes:
        raise QuotaExceeded("config.sampling.inference_slots", (
            f"a worker's KV cache would take {cache / 2**30:.1f} GiB "
            f"({inference_slots(config, quotas.worker_concurrency)} slots of "
            f"{config['model']['max_seq_len']} tokens); this deployment allows at most "
            f"{quotas.max_kv_cache_bytes / 2**30:.1f} GiB (TANDEM_MAX_KV_CACHE_BYTES)"))
    rollout = config["rollout"]
    episodes = rollout["groups_per_step"] * rollout["group_size"]
    if episodes > quotas.max_episodes_per_step:
        raise QuotaExceeded("config.rollout.groups_per_step", (
            f"a step of {episodes} episodes; this deployment allows at most "
            f"{quotas.max_episodes_per_step} (TANDEM_MAX_EPISODES_PER_STEP)"))
