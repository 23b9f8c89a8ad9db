"""Device mesh and named shardings of the train state and batch.

The mesh has three axes (:class:`tandem.configs.parallelism.MeshConfig`):

- ``data``: parameters replicated, batch split.
- ``fsdp``: batch split, and parameters and optimizer moments sharded along
  their model dimension; XLA all-gathers each weight where it is used and
  reduce-scatters its gradient.
- ``tensor``: Megatron-style model parallelism. Query/key/value, gate and up
  projections are split by output column (heads, hidden units), attention
  output and down projections by input row, so each block needs one
  all-reduce per sublayer; embedding and head are split along the vocabulary.

Every parameter gets its :class:`PartitionSpec` from :data:`PARAM_RULES`,
matched on its path (``blocks/0/attention/query/kernel``). Optimizer moments
have the same path with a prefix (``.../mu/blocks/0/...``) and match the same
rules, so they are sharded exactly like their parameters. A mesh axis that
does not divide a dimension is dropped for that dimension (it is replicated
instead), so odd vocabularies or head counts still run.

Multi-host: :func:`initialize_distributed` joins the processes (see
docs/multi_host.md); after that ``jax.devices()`` lists every host's devices,
:func:`make_mesh` spans them all, and the ``shard_*`` helpers build global
arrays from values every process holds in full.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from tandem.configs.parallelism import MeshConfig
from trainer.train_batch import TrainBatch
from trainer.train_state import TrainState

logger = logging.getLogger(__name__)

MESH_AXES = ("data", "fsdp", "tensor")
# The batch dimension is split over both data-parallel axes.
BATCH_AXES = ("data", "fsdp")

# Projections whose output columns are split over `tensor` (column-parallel),
# and those whose input rows are (row-parallel, they follow a column-parallel one).
_COLUMN = r"attention/(query|key|value)|mlp/(gate|up)"
_ROW = r"attention/output|mlp/down"

# (regular expression searched in the parameter path, spec); the first match wins,
# anything unmatched (norm scales, scalars) is replicated. LoRA adapters follow
# their base kernel: A [in, r] is split like the kernel's input dimension, B
# [r, out] like its output dimension, so x @ A @ B needs the same collectives
# as x @ W and the rank dimension is never split.
PARAM_RULES: tuple[tuple[str, P], ...] = (
    (r"(^|/)embedding/embedding$", P("tensor", "fsdp")),
    (r"(^|/)head/kernel$", P("fsdp", "tensor")),
    (r"(^|/)head/bias$", P("tensor")),
    (rf"({_COLUMN})/kernel$", P("fsdp", "tensor")),
    (rf"({_COLUMN})/bias$", P("tensor")),
    (rf"({_COLUMN})/lora_a$", P("fsdp", None)),
    (rf"({_COLUMN})/lora_b$", P(None, "tensor")),
    (rf"({_ROW})/kernel$", P("tensor", "fsdp")),
    (rf"({_ROW})/lora_a$", P("tensor", None)),
    (rf"({_ROW})/lora_b$", P(None, "fsdp")),
)


@dataclasses.dataclass(frozen=True)
class StepShardings:
    """What :func:`trainer.train_step.make_train_step` pins its inputs and outputs to."""

    # A TrainState whose leaves are the NamedSharding of each state array.
    state: TrainState
    # Applied to every leaf of a TrainBatch: leading (batch) dimension over BATCH_AXES.
    batch: NamedSharding
    # Metrics are scalars, replicated.
    metrics: NamedSharding


# How long a process of a multi-process trainer that stops answering (its host gone, or hung) takes
# to end the JAX job: its coordination service then aborts every other process, and the reaper
# queues their run again. JAX's default is 100 s; its heartbeats come from threads of their own, so
# a long compile or checkpoint never delays them. (A process that dies outright is noticed sooner,
# at the next collective: its connections close.)
DISTRIBUTED_HEARTBEAT_TIMEOUT_S = 30


def distributed_heartbeat_timeout_s() -> int:
    """``TANDEM_DISTRIBUTED_HEARTBEAT_TIMEOUT_S``, or :data:`DISTRIBUTED_HEARTBEAT_TIMEOUT_S` when unset."""
    return int(os.environ.get("TANDEM_DISTRIBUTED_HEARTBEAT_TIMEOUT_S", DISTRIBUTED_HEARTBEAT_TIMEOUT_S))


def initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    heartbeat_timeout_s: int | None = None,
) -> bool:
    """Join a multi-host JAX job when one is configured; returns whether it did.

    Arguments default to the environment variables ``TANDEM_COORDINATOR_ADDRESS``
    (``host:port`` of process 0), ``TANDEM_NUM_PROCESSES`` and
    ``TANDEM_PROCESS_ID``, and ``heartbeat_timeout_s`` to
    ``TANDEM_DISTRIBUTED_HEARTBEAT_TIMEOUT_S`` (:data:`DISTRIBUTED_HEARTBEAT_TIMEOUT_S` when unset). With
    neither a coordinator nor more than one process configured this is a no-op
    (single host). Must run before
    anything touches a JAX device; calling it again is a no-op.
    """
    if coordinator_address is None:
        coordinator_address = os.environ.get("TANDEM_COORDINATOR_ADDRESS") or None
    if num_processes is None and os.environ.get("TANDEM_NUM_PROCESSES"):
        num_processes = int(os.environ["TANDEM_NUM_PROCESSES"])
    if process_id is None and os.environ.get("TANDEM_PROCESS_ID"):
        process_id = int(os.environ["TANDEM_PROCESS_ID"])
    if coordinator_address is None and (num_processes or 1) == 1:
        return False
    if jax.distributed.is_initialized():
        return True
    if heartbeat_timeout_s is None:
        heartbeat_timeout_s = distributed_heartbeat_timeout_s()
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        heartbeat_timeout_seconds=heartbeat_timeout_s,
    )
    logger.info(
        "joined JAX job: process %d of %d, %d global devices",
        jax.process_index(),
        jax.process_count(),
        jax.device_count(),
    )
    return True


def make_mesh(config: MeshConfig, devices: list[jax.Device] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over ``devices`` (default: every device of every host).

    ``tensor`` is the fastest-varying axis, so tensor-parallel groups sit on
    neighbouring devices (the same host, over NVLink); ``data`` varies
    slowest, so its gradient all-reduce is the one that crosses hosts.
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = config.axis_sizes(len(devices))
    return Mesh(
        np.asarray(devices).reshape(shape),
        MESH_AXES,
        axis_types=(AxisType.Auto,) * len(MESH_AXES),
    )


def path_name(keypath: tuple[Any, ...]) -> str:
    """``blocks/0/attention/query/kernel`` for a jax key path (Variable ``.value`` dropped)."""
    parts = []
    for key in keypath:
        if isinstance(key, jax.tree_util.DictKey):
            parts.append(str(key.key))
        elif isinstance(key, jax.tree_util.SequenceKey):
            parts.append(str(key.idx))
        elif isinstance(key, jax.tree_util.GetAttrKey):
            parts.append(key.name)
        else:
            parts.append(str(key))
    if parts and parts[-1] == "value":
        parts.pop()
    return "/".join(parts)


def partition_spec(path: str, shape: tuple[int, ...], mesh: Mesh) -> P:
    """The spec :data:`PARAM_RULES` give ``path``, minus axes that do not divide ``shape``."""
    spec = P()
    for pattern, rule in PARAM_RULES:
        if re.search(pattern, path):
            spec = rule
            break
    if len(spec) > len(shape):
        return P()
    fitted = []
    for dimension, axes in zip(shape, spec, strict=False):
        names = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
        ways = int(np.prod([mesh.shape[name] for name in names])) if names else 1
        if ways > 1 and dimension % ways == 0:
            fitted.append(axes)
        else:
            fitted.append(None)
    return P(*fitted)


def tree_shardings(tree: Any, mesh: Mesh) -> Any:
    """The NamedSharding of every array leaf of ``tree`` (arrays or ShapeDtypeStructs)."""
    return jax.tree_util.tree_map_with_path(
        lambda keypath, leaf: NamedSharding(
            mesh, partition_spec(path_name(keypath), np.shape(leaf), mesh)
        ),
        tree,
    )


def step_shardings(mesh: Mesh, state: TrainState) -> StepShardings:
    """Shardings for a train step over ``mesh``; ``state`` may be abstract (``jax.eval_shape``)."""
    return StepShardings(
        state=tree_shardings(state, mesh),
        batch=NamedSharding(mesh, P(BATCH_AXES)),
        metrics=NamedSharding(mesh, P()),
    )


def _put(tree: Any, shardings: Any) -> Any:
    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)
    return jax.tree.map(_put_across_hosts, tree, shardings)


def _put_across_hosts(leaf: Any, sharding: NamedSharding) -> jax.Array:
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
        # Already spread over the hosts (restored from a checkpoint, computed by a collective):
        # kept as it is, or laid out anew by a collective every process makes.
        return leaf if leaf.sharding == sharding else jax.device_put(leaf, sharding)
    # Every process holds the whole value; each builds the shards its own devices need.
    return jax.make_array_from_callback(np.shape(leaf), sharding, lambda index: np.asarray(leaf)[index])


def host_copy(tree: Any) -> Any:
    """``tree``'s arrays whole on this host, however they are sharded.

    Across hosts this gathers the shards of every process: a collective, so each
    process calls it at the same point.
    """
    if jax.process_count() == 1:
        return jax.device_get(tree)
    return multihost_utils.process_allgather(tree, tiled=True)


def shard_train_state(state: TrainState, shardings: StepShardings) -> TrainState:
    """Lay ``state`` out as ``shardings.state`` says."""
    return _put(state, shardings.state)


def batch_ways(shardings: StepShardings) -> int:
    """Devices a batch's rows are split over (data x fsdp): its row count must be a multiple of it."""
    mesh = shardings.batch.mesh
    return int(mesh.shape["data"] * mesh.shape["fsdp"])


def shard_batch(batch: TrainBatch, shardings: StepShardings) -> TrainBatch:
    """Split ``batch`` over the data-parallel axes.

    Raises:
      ValueError: the batch size is not a multiple of data x fsdp.
    """
    ways = batch_ways(shardings)
    rows = batch.tokens.shape[0]
    if rows % ways:
        raise ValueError(
            f"batch of {rows} rows cannot be split over data x fsdp = {ways} devices; "
            "make the batch size a multiple of it"
        )
    return _put(batch, jax.tree.map(lambda _: shardings.batch, batch))
