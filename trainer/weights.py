"""Publishing policy weights to producers, and picking them up there.

Small models travel through Redis: one hash per run holding ``version`` and a
msgpack ``blob`` of the parameters, written in one transaction so a reader
never pairs a version with another version's blob.
"""

from __future__ import annotations

import jax
import numpy as np
import redis
from flax import nnx, serialization

from tandem.contracts import weights_key


def _plain(tree):
    """Nested dicts with string keys, as msgpack round-trips them."""
    if isinstance(tree, dict):
        return {str(key): _plain(value) for key, value in tree.items()}
    return np.asarray(tree)


def serialize_params(params: nnx.State) -> bytes:
    return serialization.msgpack_serialize(_plain(jax.device_get(nnx.to_pure_dict(params))))


def deserialize_params(blob: bytes, like: nnx.State) -> nnx.State:
    """Parameters from ``blob``, shaped and typed like ``like`` (checked)."""
    restored = serialization.msgpack_restore(blob)
    template = nnx.to_pure_dict(like)

    def rebuild(template_node, restored_node, path):
        if isinstance(template_node, dict):
            return {
                key: rebuild(value, restored_node[str(key)], f"{path}/{key}")
                for key, value in template_node.items()
            }
        array = np.asarray(restored_node)
        if array.shape != template_node.shape:
            raise ValueError(f"published weights at {path} have shape {array.shape}, expected {template_node.shape}")
        return jax.numpy.asarray(array, dtype=template_node.dtype)

    state = jax.tree.map(lambda x: x, like)
    nnx.replace_by_pure_dict(state, rebuild(template, restored, ""))
    return state


class RedisWeightPublisher:
    def __init__(self, client: redis.Redis):
        self._redis = client

    def publish(self, *, run_id: int, version: int, params: nnx.State) -> int:
        """Publish ``params`` as ``version``; returns the bytes written."""
        blob = serialize_params(params)
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(weights_key(run_id), mapping={"version": version, "blob": blob})
            pipe.execute()
        return len(blob)


class RedisWeightSubscriber:
    def __init__(self, client: redis.Redis):
        self._redis = client

    def latest_version(self, run_id: int) -> int | None:
        version = self._redis.hget(weights_key(run_id), "version")
        return None if version is None else int(version)

    def fetch(self, run_id: int, like: nnx.State) -> tuple[int, nnx.State] | None:
        version, blob = self._redis.hmget(weights_key(run_id), ["version", "blob"])
        if version is None or blob is None:
            return None
        return int(version), deserialize_params(blob, like)
