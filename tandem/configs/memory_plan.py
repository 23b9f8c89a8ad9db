"""A run's expected peak memory, from its config alone: the trainer's and one producer engine's.

The platform computes it when a run is created (``POST /api/runs/`` returns it, the run page shows
it) and refuses a run whose trainer would need more than the operator declares
(``TANDEM_TRAINER_MEMORY_BYTES``), with a 400 that names the settings that shrink it. No JAX and no
weights: the architecture comes from the config, or from the checkpoint's ``config.json``
(:func:`tandem.configs.quotas.architecture`).

**The trainer** holds, for the whole run:

- the parameters (``model.param_dtype``) and, with a KL penalty, the reference's copy of them;
- the gradients and Adam's two moments of the trained parameters (the LoRA adapters only, with LoRA),
  in the parameters' dtype; with micro-batches, a float32 accumulator of the gradients too;

and, for one micro-batch at a time (``memory.micro_batch_tokens`` of rows of the longest length bucket,
or of the longest packed row that ``memory.pack_row_tokens`` or ``memory.pack_padding_target`` allows;
or the whole step), the activations its backward pass keeps under ``memory.remat``, and the float32
logits of ``memory.logits_chunk_tokens`` tokens: :data:`LOGITS_BUFFERS` of them by the trainer's device
platform, three (the logits, their softmax and its gradient) where it is not known. The largest batch is
taken: every episode of a step (``rollout.groups_per_step x rollout.group_size``) in a row of its own.

**A producer's engine** holds the weights, the KV cache of its slots
(:func:`tandem.configs.quotas.kv_cache_bytes`) and the float32 logits of one decode step of every slot.

It is an estimate: XLA's own temporaries and the host process around it (Python, the runtime, buffers
in flight) come on top, which :data:`OVERHEAD_BYTES` and :data:`TEMPORARIES_FACTOR` approximate.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from tandem.configs.memory import budget_rows, packed_row_lengths
from tandem.configs.quotas import (
    DTYPE_BYTES,
    Architecture,
    QuotaExceeded,
    architecture,
    inference_slots,
    kv_cache_bytes,
    parameter_count,
)

#: The process around the arrays: the interpreter, JAX's runtime and compiled programs.
OVERHEAD_BYTES = 600 * 2**20
#: XLA's temporaries beside the arrays the plan counts (fusion outputs, transposed copies).
TEMPORARIES_FACTOR = 1.15
#: The float32 ``chunk x vocabulary`` buffers a trainer's step holds at once, by JAX platform. On a TPU
#: XLA fuses the softmax and its gradient into about one: the compiled step's temporaries grow by 1.10
#: buffers from logits chunks of 512 to 2,048 tokens (Gemma 3 270M, bench/README.md, session 46). On a
#: CPU, and on a GPU (not measured yet, so erring safe), three.
LOGITS_BUFFERS = {"tpu": 1}
DEFAULT_LOGITS_BUFFERS = 3


@dataclasses.dataclass(frozen=True)
class TrainerMemoryPlan:
    """The trainer's expected peak, by part, in bytes."""

    parameters_bytes: int
    reference_bytes: int
    gradients_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    logits_bytes: int
    # How many float32 chunk x vocabulary buffers logits_bytes counts (LOGITS_BUFFERS).
    logits_buffers: int
    # Rows of the step's batch, and rows and micro-batches the step runs them in, at length_tokens.
    batch_rows: int
    micro_batch_rows: int
    micro_batches: int
    length_tokens: int
    trained_parameters: int
    peak_bytes: int


@dataclasses.dataclass(frozen=True)
class ProducerMemoryPlan:
    """One producer engine's expected peak, by part, in bytes."""

    weights_bytes: int
    kv_cache_bytes: int
    logits_bytes: int
    slots: int
    peak_bytes: int


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    trainer: TrainerMemoryPlan
    producer: ProducerMemoryPlan

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {"trainer": dataclasses.asdict(self.trainer), "producer": dataclasses.asdict(self.producer)}


def lora_parameter_count(arch: Architecture, lora: dict[str, Any]) -> int:
    """Parameters of the adapters ``lora`` adds: ``rank x (in + out)`` per target of every block."""
    query, kv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    shapes = {
        "attention.query": (arch.d_model, query), "attention.key": (arch.d_model, kv),
        "attention.value": (arch.d_model, kv), "attention.output": (query, arch.d_model),
        "mlp.gate": (arch.d_model, arch.mlp_dim), "mlp.up": (arch.d_model, arch.mlp_dim),
        "mlp.down": (arch.mlp_dim, arch.d_model),
    }
    per_block = sum(lora["rank"] * sum(shapes[target]) for target in lora["targets"])
    return arch.num_layers * per_block


def activation_elements_per_token(arch: Architecture, *, length: int, remat: str,
                                  query_chunk: int | None = None) -> int:
    """Elements one token keeps for the backward pass of the whole stack, under ``remat``.

    Per block, without remat: the two norms' inputs and outputs and the residual (5 x d_model),
    queries, keys and values before and after the rotary embedding and the attention's output
    (3 x q + 3 x kv), its probabilities over the keys (heads x length, or heads x ``query_chunk`` where a
    row is longer), and the MLP's gate, up, their activation and product (4 x mlp). ``save_matmuls`` keeps the matmul outputs only (q, kv, the
    scores, the attention output, the projections, gate, up, down); ``full`` keeps each block's input
    and one block's full set while it is recomputed.
    """
    query, kv = arch.num_heads * arch.head_dim, arch.num_kv_heads * arch.head_dim
    # A row longer than a query chunk attends a chunk at a time, recomputing its scores in the backward
    # pass (policy.model._attend_in_query_chunks): chunk x length scores per row, chunk per token.
    scores = arch.num_heads * min(length, query_chunk or length)
    full_block = 5 * arch.d_model + 3 * query + 3 * kv + scores + 4 * arch.mlp_dim
    if remat == "none":
        return arch.num_layers * full_block
    if remat == "save_matmuls":
        return arch.num_layers * (2 * query + 2 * kv + scores + 2 * arch.d_model + 2 * arch.mlp_dim)
    return arch.num_layers * arch.d_model + full_block


def trainer_memory_plan(config: dict[str, Any], *, arch: Architecture | None = None,
                        device_platform: str | None = None) -> TrainerMemoryPlan:
    """The trainer's plan for ``config`` (a normalised run config, as JSON); ``arch``: its architecture,
    when the caller has read it already; ``device_platform``: the JAX platform of the trainer's devices
    (``tpu``), None where it is a CPU or not known."""
    arch = arch or architecture(config["model"])
    dtype_bytes = DTYPE_BYTES[config["model"]["param_dtype"]]
    parameters = parameter_count(arch)
    lora = config.get("lora") or {}
    algorithm = config["algorithm"]
    value_head = arch.d_model + 1 if algorithm.get("value") else 0
    trained = (lora_parameter_count(arch, lora) if lora.get("enabled") else parameters) + value_head
    rollout = config["rollout"]
    memory = config.get("memory") or {}
    rows = max(rollout["groups_per_step"] * rollout["group_size"], config.get("sft_batch_size", 0))
    length = int(config["model"]["max_seq_len"])
    if memory.get("pack_episodes"):
        # The longest packed row a step may take; a row holds one or more episodes, so rows stay at most one per episode.
        length = packed_row_lengths(length, pack_row_tokens=memory.get("pack_row_tokens"),
                                    pack_padding_target=memory.get("pack_padding_target"))[-1]
    # The largest micro-batch the budget allows: the step may split a batch finer, never coarser.
    rows_each = budget_rows(rows, length, memory.get("micro_batch_tokens"))
    micro_batches = math.ceil(rows / rows_each)
    micro_tokens = rows_each * length
    remat = memory.get("remat", "none")
    # Activations in the model's dtype; the final hidden states and the statistics in float32.
    kept = activation_elements_per_token(arch, length=length, remat=remat,
                                         query_chunk=memory.get("attention_query_chunk_tokens"))
    activations = micro_tokens * (kept * dtype_bytes + 4 * (arch.d_model * 2 + 8))
    chunk_positions = max(1, memory.get("logits_chunk_tokens", 8192) // rows_each)
    logits_buffers = LOGITS_BUFFERS.get(device_platform or "", DEFAULT_LOGITS_BUFFERS)
    logits = logits_buffers * 4 * arch.vocab_size * rows_each * min(chunk_positions, length)
    parts = {
        "parameters_bytes": (parameters + value_head) * dtype_bytes,
        "reference_bytes": parameters * dtype_bytes if algorithm.get("kl") else 0,
        "gradients_bytes": trained * dtype_bytes + (trained * 4 if micro_batches > 1 else 0),
        "optimizer_bytes": 2 * trained * dtype_bytes,
        "activations_bytes": activations,
        "logits_bytes": logits,
    }
    peak = OVERHEAD_BYTES + int(TEMPORARIES_FACTOR * sum(parts.values()))
    return TrainerMemoryPlan(**parts, logits_buffers=logits_buffers, batch_rows=rows, micro_batch_rows=rows_each, micro_batches=micro_batches,
                             length_tokens=length, trained_parameters=trained, peak_bytes=peak)


def producer_memory_plan(config: dict[str, Any], *, worker_concurrency: int,
                         arch: Architecture | None = None) -> ProducerMemoryPlan:
    """One producer engine's plan for ``config`` with ``worker_concurrency`` task threads sharing it."""
    arch = arch or architecture(config["model"])
    slots = inference_slots(config, worker_concurrency)
    weights = parameter_count(arch) * DTYPE_BYTES[config["model"]["param_dtype"]]
    cache = kv_cache_bytes(config, arch, worker_concurrency)
    logits = 4 * slots * arch.vocab_size
    return ProducerMemoryPlan(weights_bytes=weights, kv_cache_bytes=cache, logits_bytes=logits, slots=slots,
                              peak_bytes=OVERHEAD_BYTES + int(TEMPORARIES_FACTOR * (weights + cache + logits)))


def memory_plan(config: dict[str, Any], *, worker_concurrency: int,
                trainer_platform: str | None = None) -> MemoryPlan:
    """The trainer's and one producer engine's plan for ``config`` (a normalised run config, as JSON), the
    trainer's on devices of ``trainer_platform``."""
    # Read once: the architecture may come from the checkpoint's config.json.
    arch = architecture(config["model"])
    return MemoryPlan(trainer=trainer_memory_plan(config, arch=arch, device_platform=trainer_platform),
                      producer=producer_memory_plan(config, worker_concurrency=worker_concurrency, arch=arch))


def check_trainer_memory(plan: TrainerMemoryPlan, *, limit_bytes: int | None, setting: str) -> None:
    """Raise QuotaExceeded naming the setting to change when ``plan`` needs more than ``limit_bytes``.

    The field named is the one that shrinks the largest part: ``memory.micro_batch_tokens`` when the
    micro-batch's activations and logits dominate, else ``lora.enabled`` (training adapters only drops
    the gradients and optimizer moments of the whole model).
    """
    if limit_bytes is None or plan.peak_bytes <= limit_bytes:
        return
    per_batch = plan.activations_bytes + plan.logits_bytes
    fixed = plan.parameters_bytes + plan.reference_bytes + plan.gradients_bytes + plan.optimizer_bytes
    gib = 2**30
    advice = (f"lower memory.micro_batch_tokens (now {plan.micro_batch_rows * plan.length_tokens:,} tokens a "
              f"micro-batch) or memory.logits_chunk_tokens, or set memory.remat to full")
    field = "config.memory.micro_batch_tokens"
    if per_batch < fixed:
        field = "config.lora.enabled"
        advice = ("enable lora (adapters only: no gradients or optimizer moments of the whole model), use "
                  "model.param_dtype bfloat16, or drop algorithm.kl (its reference copy)")
    raise QuotaExceeded(field, (
        f"the trainer would need about {plan.peak_bytes / gib:.1f} GiB (parameters, gradients and optimizer "
        f"{fixed / gib:.1f} GiB, one micro-batch's activations and logits {per_batch / gib:.1f} GiB); this "
        f"deployment's trainer has {limit_bytes / gib:.1f} GiB ({setting}): {advice}"))
