"""Publishing policy weights to producers, and picking them up there.

Models travel through Redis by default: one hash per run (``weights_key``),
written in one transaction per version so a reader never pairs a version
with another version's weights. Every serialized tree is cut into chunks of
at most ``chunk_bytes`` (64 MiB), each its own hash field named
``<tree>:<version>:<index>``, so no Redis value comes near Redis's 512 MB
limit on one value (or its 1 GB limit on one command) whatever the model's
size; ``<tree>_chunks`` says ``<version>:<count>``. Its fields:

- ``version``: the newest policy version.
- Full fine-tuning: the chunks of ``blob``, msgpack of all parameters of that version.
- LoRA: the chunks of ``base`` (msgpack of the frozen base parameters, in the
  plain model's layout) with ``base_version``, the version it was written with;
  the chunks of ``adapters`` (msgpack of the ``nnx.LoRAParam`` leaves of
  ``version``) and ``lora_scale`` (alpha / rank). The base is sent once per
  run, with the first version; every later version sends only the adapters,
  a few percent of the bytes.

A reader that finds a chunk of the version it read gone (a newer version
replaced it meanwhile) reads again. Floating parameters may be published in
bfloat16 (``publish_dtype``), half the bytes; producers cast them back to
their model's dtype.

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
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx, serialization
from jax.experimental import multihost_utils

from policy.lora import fold_adapters, split_adapters
from tandem.configs.parallelism import LoRAConfig
from tandem.configs.weights import PublishDtype, WeightTransport
from tandem.contracts import weights_key

if TYPE_CHECKING:
    # Only annotations need it: exporting a checkpoint imports this package without Redis.
    import redis

# Hash fields of weights_key(run_id); see the module docstring. FULL, BASE and
# ADAPTERS name chunked trees: fields "<tree>:<version>:<index>" and "<tree>_chunks".
VERSION_FIELD = "version"
FULL_FIELD = "blob"
BASE_FIELD = "base"
BASE_VERSION_FIELD = "base_version"
ADAPTERS_FIELD = "adapters"
LORA_SCALE_FIELD = "lora_scale"
PATH_FIELD = "path"
# The host name of the trainer that wrote the filesystem transport's directory, for the error a
# producer on another host gives when it cannot see the directory.
WRITTEN_ON_FIELD = "written_on"
_TREES = (FULL_FIELD, BASE_FIELD, ADAPTERS_FIELD)

#: The largest Redis value a publisher writes: far under Redis's 512 MB per value and
#: 1 GB per command, and small enough that one chunk never holds the server up for long.
REDIS_CHUNK_BYTES = 64 * 2**20


def _chunks_field(tree: str) -> str:
    return f"{tree}_chunks"


def _chunk_fields(tree: str, version: int, blob: bytes, chunk_bytes: int) -> dict[str, bytes | str]:
    """The hash fields that hold ``blob`` as ``tree`` of ``version``, and its chunk count."""
    count = max(1, -(-len(blob) // chunk_bytes))
    view = memoryview(blob)
    fields: dict[str, bytes | str] = {
        f"{tree}:{version}:{index}": bytes(view[index * chunk_bytes:(index + 1) * chunk_bytes])
        for index in range(count)
    }
    fields[_chunks_field(tree)] = f"{version}:{count}"
    return fields


def _stale_fields(existing: list[bytes], kept: set[str], trees: tuple[str, ...]) -> list[str]:
    """Chunk fields of ``trees`` in the hash that the new version no longer points at."""
    names = (field.decode() for field in existing)
    return [name for name in names
            if name.partition(":")[0] in trees and ":" in name and name not in kept]


def _cast_for_publishing(params: nnx.State, publish_dtype: PublishDtype):
    if publish_dtype == "as_trained":
        return params
    return jax.tree.map(
        lambda leaf: leaf.astype(jnp.bfloat16) if jnp.issubdtype(leaf.dtype, jnp.floating) else leaf, params
    )


def publication_bytes(params: nnx.State, publish_dtype: PublishDtype = "as_trained") -> int:
    """Bytes of ``params`` as a publisher would send them (before msgpack's small overhead)."""
    itemsize = {"as_trained": None, "bfloat16": 2}[publish_dtype]
    return sum(
        leaf.size * (itemsize if itemsize and jnp.issubdtype(leaf.dtype, jnp.floating) else leaf.dtype.itemsize)
        for leaf in jax.tree.leaves(params)
    )


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
    """Writes each new policy version in bounded chunks; with LoRA, the base once and then adapters only.

    One publisher per trainer process. It remembers which base it wrote; if
    the hash lost it (keys deleted, another trainer took over the run) the
    next publish sends the base again.
    """

    def __init__(self, client: redis.Redis, *, lora: LoRAConfig | None = None,
                 publish_dtype: PublishDtype = "as_trained", chunk_bytes: int = REDIS_CHUNK_BYTES,
                 key_of: Callable[[int], str] = weights_key):
        self._redis = client
        # The hash of a run's weights: its live policy, or a version kept for an evaluation.
        self._key_of = key_of
        self._lora_scale = lora.scale if lora is not None and lora.enabled else None
        self._publish_dtype = publish_dtype
        self._chunk_bytes = chunk_bytes
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
        key = self._key_of(run_id)
        if not lora:
            blob = serialize_params(_cast_for_publishing(base, self._publish_dtype))
            fields = _chunk_fields(FULL_FIELD, version, blob, self._chunk_bytes)

            def write_full(pipe: redis.client.Pipeline) -> None:
                stale = _stale_fields(pipe.hkeys(key), set(fields), _TREES)
                pipe.multi()
                self._write(pipe, key, {VERSION_FIELD: version, **fields})
                pipe.hdel(key, *stale, _chunks_field(BASE_FIELD), _chunks_field(ADAPTERS_FIELD),
                          BASE_VERSION_FIELD, LORA_SCALE_FIELD, PATH_FIELD, WRITTEN_ON_FIELD)

            self._redis.transaction(write_full, key)
            return len(blob)

        adapters_blob = serialize_params(_cast_for_publishing(adapters, self._publish_dtype))
        written, base_version = 0, None

        def write_lora(pipe: redis.client.Pipeline) -> None:
            nonlocal written, base_version
            published = pipe.hget(key, BASE_VERSION_FIELD)
            base_version = None if published is None else int(published)
            fields = {VERSION_FIELD: version, LORA_SCALE_FIELD: repr(self._lora_scale),
                      **_chunk_fields(ADAPTERS_FIELD, version, adapters_blob, self._chunk_bytes)}
            written = len(adapters_blob)
            kept_trees: tuple[str, ...] = (FULL_FIELD, ADAPTERS_FIELD)
            if base_version is None or base_version != self._base_versions.get(run_id):
                base_blob = serialize_params(_cast_for_publishing(base, self._publish_dtype))
                fields |= {BASE_VERSION_FIELD: version,
                           **_chunk_fields(BASE_FIELD, version, base_blob, self._chunk_bytes)}
                base_version = version
                written += len(base_blob)
                kept_trees = _TREES
            stale = _stale_fields(pipe.hkeys(key), set(fields), kept_trees)
            pipe.multi()
            self._write(pipe, key, fields)
            pipe.hdel(key, *stale, _chunks_field(FULL_FIELD), PATH_FIELD, WRITTEN_ON_FIELD)

        # Retried if the hash changes between the check and the write.
        self._redis.transaction(write_lora, key)
        self._base_versions[run_id] = base_version
        return written

    @staticmethod
    def _write(pipe: redis.client.Pipeline, key: str, fields: dict) -> None:
        # One command per chunk, so no command is larger than a chunk; MULTI makes them one write.
        for field, value in fields.items():
            pipe.hset(key, field, value)

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


class WeightsNotVisibleError(RuntimeError):
    """The filesystem transport's directory is not on this host: producers cannot load the policy.

    Not a passing state to wait out: the trainer writes its weights on a storage this host does not
    mount, so every try would fail the same way.
    """

    def __init__(self, *, path: str, written_on: str, read_on: str):
        self.path, self.written_on, self.read_on = path, written_on, read_on
        super().__init__(
            f"weights.transport is 'filesystem', but {path}, which the trainer on host {written_on!r} wrote, "
            f"does not exist on producer host {read_on!r}: the hosts share no storage at that path. Mount the "
            "same storage at that path on every producer host (weights.dir / TANDEM_WEIGHT_DIR), or use "
            "weights.transport 'redis'"
        )


class RedisWeightSubscriber:
    """Reads the newest published policy as plain-model parameters, caching a LoRA base."""

    def __init__(self, client: redis.Redis, *, key_of: Callable[[int], str] = weights_key):
        self._redis = client
        self._key_of = key_of
        # run_id -> (base_version, msgpack-restored base tree).
        self._bases: dict[int, tuple[int, dict]] = {}

    def latest_version(self, run_id: int) -> int | None:
        version = self._redis.hget(self._key_of(run_id), VERSION_FIELD)
        return None if version is None else int(version)

    def fetch(self, run_id: int, like: nnx.State) -> tuple[int, nnx.State] | None:
        """``(version, params)`` of the newest version, or None if nothing is published.

        ``like`` is the parameter State of the plain model (no adapters);
        LoRA adapters come back folded into its kernels.
        """
        key = self._key_of(run_id)
        fields = [VERSION_FIELD, PATH_FIELD, _chunks_field(FULL_FIELD), BASE_VERSION_FIELD,
                  _chunks_field(ADAPTERS_FIELD), LORA_SCALE_FIELD]
        # Another attempt covers chunks replaced by a newer version between the reads below.
        for _ in range(5):
            version, path, full_chunks, base_version, adapters_chunks, lora_scale = self._redis.hmget(key, fields)
            if version is None:
                return None
            if path is not None:
                directory = Path(path.decode())
                if not directory.is_dir():
                    written_on = self._redis.hget(key, WRITTEN_ON_FIELD)
                    raise WeightsNotVisibleError(path=str(directory), read_on=socket.gethostname(),
                                                 written_on=written_on.decode() if written_on else "unknown")
                return int(version), load_params_from_directory(directory, like)
            if full_chunks is not None:
                blob = self._read_chunks(key, FULL_FIELD, full_chunks)
                if blob is not None:
                    return int(version), deserialize_params(blob, like)
                continue
            if adapters_chunks is None or base_version is None:
                return None
            base = self._base(run_id, int(base_version))
            adapters_blob = self._read_chunks(key, ADAPTERS_FIELD, adapters_chunks)
            if base is not None and adapters_blob is not None:
                adapters = serialization.msgpack_restore(adapters_blob)
                folded = fold_adapters(base, adapters, float(lora_scale))
                return int(version), _params_like(folded, like)
        return None

    def _read_chunks(self, key: str, tree: str, chunks: bytes) -> bytes | None:
        """The blob of ``tree`` that ``chunks`` ("version:count") points at; None if a chunk is gone."""
        version, _, count = chunks.decode().partition(":")
        parts = []
        for index in range(int(count)):
            part = self._redis.hget(key, f"{tree}:{version}:{index}")
            if part is None:
                return None
            parts.append(part)
        return b"".join(parts)

    def _base(self, run_id: int, base_version: int) -> dict | None:
        cached = self._bases.get(run_id)
        if cached is not None and cached[0] == base_version:
            return cached[1]
        key = self._key_of(run_id)
        stored_version, chunks = self._redis.hmget(key, [BASE_VERSION_FIELD, _chunks_field(BASE_FIELD)])
        if stored_version is None or int(stored_version) != base_version or chunks is None:
            return None
        blob = self._read_chunks(key, BASE_FIELD, chunks)
        if blob is None:
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
                pipe.hset(weights_key(run_id), mapping={VERSION_FIELD: version, PATH_FIELD: str(directory),
                                                        WRITTEN_ON_FIELD: socket.gethostname()})
                stale = _stale_fields(self._redis.hkeys(weights_key(run_id)), set(), _TREES)
                pipe.hdel(weights_key(run_id), *stale, *map(_chunks_field, _TREES), BASE_VERSION_FIELD,
                          LORA_SCALE_FIELD)
                pipe.execute()
            self._prune(run_dir, newest=version)
        return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())

    def _prune(self, run_dir: Path, *, newest: int) -> None:
        for old in run_dir.glob("v*"):
            if old.name[1:].isdigit() and int(old.name[1:]) <= newest - self._keep:
                shutil.rmtree(old, ignore_errors=True)


class WeightsTooLargeForRedisError(ValueError):
    """A run asked for the Redis transport with more weights than it allows; nothing was sent."""


def weight_publisher(
    client: redis.Redis,
    *,
    transport: WeightTransport,
    directory: Path | None = None,
    lora: LoRAConfig | None = None,
    parameter_bytes: int = 0,
    redis_max_bytes: int | None = None,
    publish_dtype: PublishDtype = "as_trained",
) -> WeightPublisher:
    """The publisher of a run's ``transport``, chosen before anything is sent.

    ``"redis"``: :class:`RedisWeightPublisher` (chunked; with ``lora`` enabled,
    adapters travel alone after the first version). ``"filesystem"``:
    :class:`FilesystemWeightPublisher` under ``directory``, which every
    producer mounts (always full parameters, as trained). ``"auto"``: Redis
    while ``parameter_bytes`` (what one publication sends, see
    :func:`publication_bytes`) is at most ``redis_max_bytes``, else the filesystem.

    Raises:
      WeightsTooLargeForRedisError: ``"redis"`` with ``parameter_bytes`` over ``redis_max_bytes``.
    """
    over_redis_limit = redis_max_bytes is not None and parameter_bytes > redis_max_bytes
    if transport == "auto":
        transport = "filesystem" if over_redis_limit else "redis"
    if transport == "redis":
        if over_redis_limit:
            raise WeightsTooLargeForRedisError(
                f"one publication of these weights is {parameter_bytes / 2**20:.0f} MiB, over "
                f"weights.redis_max_mb ({redis_max_bytes / 2**20:.0f} MiB): set weights.transport to "
                "'filesystem' (weights.dir, a directory every producer mounts) or 'auto', publish in "
                "bfloat16 (weights.publish_dtype), or raise weights.redis_max_mb"
            )
        return RedisWeightPublisher(client, lora=lora, publish_dtype=publish_dtype)
    if transport == "filesystem":
        if directory is None:
            raise ValueError("the filesystem weight transport needs a directory")
        if jax.process_count() > 1:
            # Its writer reads the parameters as one host's arrays; across hosts it would fail mid-run.
            raise ValueError(
                f"weights.transport 'filesystem' (chosen for {parameter_bytes / 2**20:.0f} MiB of weights) is not "
                f"supported by a trainer of {jax.process_count()} processes yet: set weights.transport to "
                "'redis' (raise weights.redis_max_mb, or publish in bfloat16 with weights.publish_dtype)")
        return FilesystemWeightPublisher(client, directory)
    raise ValueError(f"unknown weight transport {transport!r}; expected 'auto', 'redis' or 'filesystem'")
