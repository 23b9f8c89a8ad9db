"""Publishing policy weights to producers, and picking them up there.

Small models travel through Redis: one hash per run (``weights_key``),
written in one transaction per version so a reader never pairs a version
with another version's weights. Its fields:

- ``version``: the newest policy version.
- Full fine-tuning: ``blob``, msgpack of all parameters of that version.
- LoRA: ``base`` (msgpack of the frozen base parameters, in the plain
  model's layout) with ``base_version``, the version it was written with;
  ``adapters`` (msgpack of the ``nnx.LoRAParam`` leaves of ``version``) and
  ``lora_scale`` (alpha / rank). The base is sent once per run, with the
  first version; every later version sends only the adapters, a few percent
  of the bytes.

Large models travel through a shared filesystem instead
(:class:`FilesystemWeightPublisher`): each version is an Orbax checkpoint
under a directory every producer mounts, and the same Redis hash holds only
``version`` and ``path``, written after the checkpoint is complete. The
subscriber follows the pointer, so producers need no setting of their own.

Producers always get plain-model parameters: the subscriber caches the base
and folds the newest adapters into its kernels (``W + scale · A @ B``), so a
producer builds the ordinary :class:`policy.model.Transformer`, LoRA or
not, and its ``like`` is that model's parameter State.

Callers depend on the two sides' protocols, :class:`WeightPublisher` and
:class:`WeightSubscriber`; :func:`weight_publisher` picks the run's transport.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

import jax
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx, serialization
from jax.experimental import multihost_utils

from policy.lora import fold_adapters, split_adapters
from tandem.contracts import weights_key
from tandem.parallelism_config import LoRAConfig

if TYPE_CHECKING:
    # Only annotations need it: exporting a checkpoint imports this package without Redis.
    import redis

# Hash fields of weights_key(run_id); see the module docstring.
VERSION_FIELD = "version"
FULL_FIELD = "blob"
BASE_FIELD = "base"
BASE_VERSION_FIELD = "base_version"
ADAPTERS_FIELD = "adapters"
LORA_SCALE_FIELD = "lora_scale"
PATH_FIELD = "path"
_LORA_FIELDS = (BASE_FIELD, BASE_VERSION_FIELD, ADAPTERS_FIELD, LORA_SCALE_FIELD)


class WeightPublisher(Protocol):
    """The trainer's side of a weight transport: hands each new policy version to the producers."""

    def publish(self, *, run_id: int, version: int, params: nnx.State) -> int:
        """Publish ``params`` (all of the trainer's, adapters included) as ``version``.

        Producers see the version only once it is complete. Returns the bytes
        written. On several hosts every process calls it.
        """
        ...


class WeightSubscriber(Protocol):
    """The producers' side: the newest published policy, as plain-model parameters."""

    def latest_version(self, run_id: int) -> int | None:
        """The newest published version, or None before the first; cheap enough to poll."""
        ...

    def fetch(self, run_id: int, like: nnx.State) -> tuple[int, nnx.State] | None:
        """``(version, params)`` of the newest version shaped like ``like``, or None if nothing is published."""
        ...


def _plain(tree):
    """Nested dicts with string keys, as msgpack round-trips them."""
    if isinstance(tree, dict):
        return {str(key): _plain(value) for key, value in tree.items()}
    return np.asarray(tree)


def serialize_params(params: nnx.State) -> bytes:
    return serialization.msgpack_serialize(_plain(jax.device_get(nnx.to_pure_dict(params))))


def _params_like(restored: dict, like: nnx.State) -> nnx.State:
    """A State shaped and typed like ``like`` from a msgpack-restored tree (checked)."""
    template = nnx.to_pure_dict(like)

    def rebuild(template_node, restored_node, path):
        if isinstance(template_node, dict):
            if not isinstance(restored_node, dict):
                raise ValueError(f"published weights have no subtree at {path or '/'}")
            missing = [key for key in template_node if str(key) not in restored_node]
            if missing:
                raise ValueError(f"published weights at {path or '/'} lack {missing}")
            return {
                key: rebuild(value, restored_node[str(key)], f"{path}/{key}")
                for key, value in template_node.items()
            }
        array = np.asarray(restored_node)
        if array.shape != template_node.shape:
            raise ValueError(
                f"published weights at {path} have shape {array.shape}, expected {template_node.shape}"
            )
        return np.asarray(array, dtype=template_node.dtype)

    # One batched transfer of every leaf: leaf by leaf, the transfers cost
    # more than decoding the whole blob.
    leaves, treedef = jax.tree.flatten(rebuild(template, restored, ""))
    state = jax.tree.map(lambda x: x, like)
    nnx.replace_by_pure_dict(state, jax.tree.unflatten(treedef, jax.device_put(leaves)))
    return state


def deserialize_params(blob: bytes, like: nnx.State) -> nnx.State:
    """Parameters from ``blob``, shaped and typed like ``like`` (checked)."""
    return _params_like(serialization.msgpack_restore(blob), like)


class RedisWeightPublisher:
    """Writes each new policy version; with LoRA, the base once and then adapters only.

    One publisher per trainer process. It remembers which base it wrote; if
    the hash lost it (keys deleted, another trainer took over the run) the
    next publish sends the base again.
    """

    def __init__(self, client: redis.Redis, *, lora: LoRAConfig | None = None):
        self._redis = client
        self._lora_scale = lora.scale if lora is not None and lora.enabled else None
        # run_id -> base_version this publisher wrote.
        self._base_versions: dict[int, int] = {}
        # run_id -> host copy of the frozen base (multi-host only; None off process 0).
        self._host_bases: dict[int, nnx.State | None] = {}

    def publish(self, *, run_id: int, version: int, params: nnx.State) -> int:
        """Publish ``params`` (all of the trainer's, adapters included) as ``version``.

        Returns the bytes written: everything the first time, adapters only
        after that when ``params`` holds LoRA adapters. On several hosts
        every process must call it (it gathers the shards); only process 0
        writes, the others return 0.

        Raises:
          ValueError: ``params`` holds adapters but the publisher has no LoRA config.
        """
        adapters, base = split_adapters(params)
        lora = bool(jax.tree.leaves(adapters))
        if lora and self._lora_scale is None:
            raise ValueError("params hold LoRA adapters: build the publisher with lora=<LoRAConfig>")
        if jax.process_count() > 1:
            adapters, base = self._gather(run_id, adapters, base, lora=lora)
            if jax.process_index() != 0:
                return 0
        key = weights_key(run_id)
        if not lora:
            blob = serialize_params(base)
            with self._redis.pipeline(transaction=True) as pipe:
                pipe.hset(key, mapping={VERSION_FIELD: version, FULL_FIELD: blob})
                pipe.hdel(key, *_LORA_FIELDS)
                pipe.execute()
            return len(blob)

        adapters_blob = serialize_params(adapters)
        written, base_version = 0, None

        def write(pipe: redis.client.Pipeline) -> None:
            nonlocal written, base_version
            published = pipe.hget(key, BASE_VERSION_FIELD)
            base_version = None if published is None else int(published)
            mapping = {VERSION_FIELD: version, ADAPTERS_FIELD: adapters_blob,
                       LORA_SCALE_FIELD: repr(self._lora_scale)}
            if base_version is None or base_version != self._base_versions.get(run_id):
                mapping |= {BASE_FIELD: serialize_params(base), BASE_VERSION_FIELD: version}
                base_version = version
            pipe.multi()
            pipe.hset(key, mapping=mapping)
            pipe.hdel(key, FULL_FIELD)
            written = len(adapters_blob) + len(mapping.get(BASE_FIELD, b""))

        # Retried if the hash changes between the check and the write.
        self._redis.transaction(write, key)
        self._base_versions[run_id] = base_version
        return written

    def _gather(
        self, run_id: int, adapters: nnx.State, base: nnx.State, *, lora: bool
    ) -> tuple[nnx.State, nnx.State | None]:
        """Host copies of parameters sharded over hosts; a collective, so every process calls it.

        With LoRA the frozen base is gathered once per run (process 0 keeps
        it, in case the hash loses it); afterwards only adapters cross hosts.
        """
        if not lora:
            return adapters, multihost_utils.process_allgather(base, tiled=True)
        adapters = multihost_utils.process_allgather(adapters, tiled=True)
        if run_id not in self._host_bases:
            gathered = multihost_utils.process_allgather(base, tiled=True)
            self._host_bases[run_id] = gathered if jax.process_index() == 0 else None
        return adapters, self._host_bases[run_id]


class RedisWeightSubscriber:
    """Reads the newest published policy as plain-model parameters, caching a LoRA base."""

    def __init__(self, client: redis.Redis):
        self._redis = client
        # run_id -> (base_version, msgpack-restored base tree).
        self._bases: dict[int, tuple[int, dict]] = {}

    def latest_version(self, run_id: int) -> int | None:
        version = self._redis.hget(weights_key(run_id), VERSION_FIELD)
        return None if version is None else int(version)

    def fetch(self, run_id: int, like: nnx.State) -> tuple[int, nnx.State] | None:
        """``(version, params)`` of the newest version, or None if nothing is published.

        ``like`` is the parameter State of the plain model (no adapters);
        LoRA adapters come back folded into its kernels.
        """
        fields = [VERSION_FIELD, FULL_FIELD, BASE_VERSION_FIELD, ADAPTERS_FIELD, LORA_SCALE_FIELD, PATH_FIELD]
        # A second attempt covers a base replaced between the two reads below.
        for _ in range(3):
            version, blob, base_version, adapters_blob, lora_scale, path = self._redis.hmget(
                weights_key(run_id), fields
            )
            if version is None:
                return None
            if path is not None:
                return int(version), load_params_from_directory(Path(path.decode()), like)
            if blob is not None:
                return int(version), deserialize_params(blob, like)
            if adapters_blob is None or base_version is None:
                return None
            base = self._base(run_id, int(base_version))
            if base is not None:
                adapters = serialization.msgpack_restore(adapters_blob)
                folded = fold_adapters(base, adapters, float(lora_scale))
                return int(version), _params_like(folded, like)
        return None

    def _base(self, run_id: int, base_version: int) -> dict | None:
        cached = self._bases.get(run_id)
        if cached is not None and cached[0] == base_version:
            return cached[1]
        stored_version, blob = self._redis.hmget(
            weights_key(run_id), [BASE_VERSION_FIELD, BASE_FIELD]
        )
        if stored_version is None or int(stored_version) != base_version or blob is None:
            return None
        base = serialization.msgpack_restore(blob)
        self._bases[run_id] = (base_version, base)
        return base


def load_params_from_directory(directory: Path, like: nnx.State) -> nnx.State:
    """Parameters of an Orbax checkpoint written by :class:`FilesystemWeightPublisher`."""
    def abstract(tree):
        if isinstance(tree, dict):
            return {str(key): abstract(value) for key, value in tree.items()}
        return jax.ShapeDtypeStruct(tree.shape, tree.dtype)

    # ``like`` may itself be abstract (a producer builds its model with eval_shape).
    target = abstract(nnx.to_pure_dict(like))
    restored = ocp.StandardCheckpointer().restore(directory.resolve(), target)
    return _params_like(jax.tree.map(np.asarray, restored), like)


def _plain_tree(params: nnx.State) -> dict:
    return _plain(jax.device_get(nnx.to_pure_dict(params)))


class FilesystemWeightPublisher:
    """Publishes each version as an Orbax checkpoint under ``root`` (shared with producers).

    The Redis pointer is written only after the checkpoint is complete, and
    the newest ``keep`` versions stay on disk so a producer still loading an
    older one never sees it vanish. Always full parameters: LoRA's
    adapters-only saving is a Redis-transport optimisation.
    """

    def __init__(self, client: redis.Redis, root: Path, *, keep: int = 3):
        self._redis = client
        self._root = root
        self._keep = keep
        self._checkpointer = ocp.StandardCheckpointer()

    def publish(self, *, run_id: int, version: int, params: nnx.State) -> int:
        """Write ``version`` and point producers at it; returns the bytes written."""
        run_dir = self._root / f"run-{run_id}"
        run_dir.mkdir(parents=True, exist_ok=True)
        directory = (run_dir / f"v{version}").resolve()
        if directory.exists():
            shutil.rmtree(directory)
        self._checkpointer.save(directory, _plain_tree(params))
        self._checkpointer.wait_until_finished()
        if jax.process_index() == 0:
            with self._redis.pipeline(transaction=True) as pipe:
                pipe.hset(weights_key(run_id), mapping={VERSION_FIELD: version, PATH_FIELD: str(directory)})
                pipe.hdel(weights_key(run_id), FULL_FIELD, *_LORA_FIELDS)
                pipe.execute()
            self._prune(run_dir, newest=version)
        return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())

    def _prune(self, run_dir: Path, *, newest: int) -> None:
        for old in run_dir.glob("v*"):
            if old.name[1:].isdigit() and int(old.name[1:]) <= newest - self._keep:
                shutil.rmtree(old, ignore_errors=True)


def weight_publisher(
    client: redis.Redis,
    *,
    transport: Literal["redis", "filesystem"],
    directory: Path | None = None,
    lora: LoRAConfig | None = None,
) -> WeightPublisher:
    """The publisher of a run's ``transport``.

    ``"redis"``: :class:`RedisWeightPublisher` (with ``lora`` enabled, adapters
    travel alone after the first version). ``"filesystem"``:
    :class:`FilesystemWeightPublisher` under ``directory``, which every
    producer mounts (always full parameters).
    """
    if transport == "redis":
        return RedisWeightPublisher(client, lora=lora)
    if transport == "filesystem":
        if directory is None:
            raise ValueError("the filesystem weight transport needs a directory")
        return FilesystemWeightPublisher(client, directory)
    raise ValueError(f"unknown weight transport {transport!r}; expected 'redis' or 'filesystem'")
