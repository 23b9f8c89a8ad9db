"""The Redis weight transport at real sizes, and choosing a run's transport.

(The filesystem transport and a producer runtime reading both: tests/trainer/test_weight_transports.py.)
"""

from __future__ import annotations

import socket

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from policy.weights import (
    FilesystemWeightPublisher,
    RedisWeightPublisher,
    RedisWeightSubscriber,
    WeightsNotVisibleError,
    WeightsTooLargeForRedisError,
    publication_bytes,
    weight_publisher,
)
from tandem.configs.parallelism import LoRAConfig
from tandem.contracts import weights_key

REDIS_MAX_VALUE = 512 * 2**20  # Redis's proto-max-bulk-len: no value may be larger


class Weights(nnx.Module):
    """Parameters of any size, standing in for a model's."""

    def __init__(self, elements: int, seed: int):
        self.kernel = nnx.Param(jnp.asarray(np.random.default_rng(seed).standard_normal(elements, np.float32)))
        self.bias = nnx.Param(jnp.full((7,), float(seed), jnp.float32))


def _params(elements: int, seed: int) -> nnx.State:
    return nnx.state(Weights(elements, seed), nnx.Param)


def _stored_value_sizes(redis_client, run_id) -> dict[bytes, int]:
    return {field: len(value) for field, value in redis_client.hgetall(weights_key(run_id)).items()}


def test_every_stored_value_is_at_most_one_chunk_and_a_new_version_replaces_the_old(redis_client, run_id):
    publisher = RedisWeightPublisher(redis_client, chunk_bytes=1000)
    subscriber = RedisWeightSubscriber(redis_client)
    like = _params(2000, 0)

    written = publisher.publish(run_id=run_id, version=0, params=_params(2000, 1))
    sizes = _stored_value_sizes(redis_client, run_id)
    assert written > 8000 and max(sizes.values()) <= 1000
    assert len([field for field in sizes if field.startswith(b"blob:0:")]) == -(-written // 1000)

    publisher.publish(run_id=run_id, version=1, params=_params(2000, 2))
    version, params = subscriber.fetch(run_id, like)
    assert version == 1
    np.testing.assert_array_equal(np.asarray(params["kernel"][...]), np.asarray(_params(2000, 2)["kernel"][...]))
    fields = redis_client.hkeys(weights_key(run_id))
    assert not [field for field in fields if field.startswith(b"blob:0:")]  # nothing of version 0 is left


def test_a_reader_of_a_version_whose_chunks_were_replaced_reads_the_newer_one(redis_client, run_id):
    publisher = RedisWeightPublisher(redis_client, chunk_bytes=1000)
    publisher.publish(run_id=run_id, version=0, params=_params(2000, 1))
    subscriber = RedisWeightSubscriber(redis_client)
    original_hget = redis_client.hget
    replaced = []

    def hget_while_a_publish_lands(key, field):
        # The trainer publishes version 1 between the reader's pointer read and its first chunk.
        if not replaced and field.startswith("blob:0:"):
            replaced.append(publisher.publish(run_id=run_id, version=1, params=_params(2000, 2)))
        return original_hget(key, field)

    redis_client.hget = hget_while_a_publish_lands
    try:
        version, params = subscriber.fetch(run_id, _params(2000, 0))
    finally:
        redis_client.hget = original_hget
    assert replaced and version == 1
    np.testing.assert_array_equal(np.asarray(params["kernel"][...]), np.asarray(_params(2000, 2)["kernel"][...]))


def test_weights_larger_than_redis_s_value_limit_publish_and_load(redis_client, run_id):
    elements = 150 * 2**20  # 600 MiB of float32, past the 512 MiB one Redis value may hold
    params = _params(elements, 3)
    publisher = RedisWeightPublisher(redis_client)
    try:
        written = publisher.publish(run_id=run_id, version=0, params=params)
        sizes = _stored_value_sizes(redis_client, run_id)
        assert written > REDIS_MAX_VALUE and max(sizes.values()) < REDIS_MAX_VALUE
        version, loaded = RedisWeightSubscriber(redis_client).fetch(
            run_id, jax.eval_shape(lambda: params))
        assert version == 0
        np.testing.assert_array_equal(np.asarray(loaded["kernel"][...]), np.asarray(params["kernel"][...]))
    finally:
        redis_client.delete(weights_key(run_id))


def test_bfloat16_publishing_halves_the_bytes_and_producers_get_their_own_dtype_back(redis_client, run_id):
    params = _params(4000, 4)
    as_trained = RedisWeightPublisher(redis_client).publish(run_id=run_id, version=0, params=params)
    halved = RedisWeightPublisher(redis_client, publish_dtype="bfloat16").publish(
        run_id=run_id, version=1, params=params)

    assert halved < 0.55 * as_trained
    assert publication_bytes(params, "bfloat16") == publication_bytes(params) // 2
    version, loaded = RedisWeightSubscriber(redis_client).fetch(run_id, params)
    assert version == 1 and loaded["kernel"][...].dtype == jnp.float32
    rounded = np.asarray(params["kernel"][...].astype(jnp.bfloat16).astype(jnp.float32))
    np.testing.assert_array_equal(np.asarray(loaded["kernel"][...]), rounded)


def test_the_run_s_transport_picks_its_publisher(redis_client, tmp_path):
    redis_publisher = weight_publisher(redis_client, transport="redis", lora=LoRAConfig(enabled=True))
    assert isinstance(redis_publisher, RedisWeightPublisher)
    assert redis_publisher._lora_scale == LoRAConfig(enabled=True).scale  # adapters travel alone
    filesystem_publisher = weight_publisher(redis_client, transport="filesystem", directory=tmp_path)
    assert isinstance(filesystem_publisher, FilesystemWeightPublisher)
    with pytest.raises(ValueError, match="needs a directory"):
        weight_publisher(redis_client, transport="filesystem")


def test_auto_picks_redis_up_to_its_limit_and_the_filesystem_above(redis_client, tmp_path):
    def auto(parameter_bytes):
        return weight_publisher(redis_client, transport="auto", directory=tmp_path,
                                parameter_bytes=parameter_bytes, redis_max_bytes=2**30)

    assert isinstance(auto(2**30), RedisWeightPublisher)
    assert isinstance(auto(2**30 + 1), FilesystemWeightPublisher)


def test_redis_asked_for_more_than_its_limit_is_refused_naming_the_other_transport(redis_client):
    with pytest.raises(WeightsTooLargeForRedisError, match="weights.transport to 'filesystem'") as refused:
        weight_publisher(redis_client, transport="redis", parameter_bytes=3 * 2**30, redis_max_bytes=2**30)
    assert "3072 MiB" in str(refused.value)


def test_a_producer_that_cannot_see_the_filesystem_transport_s_directory_is_told_the_path_and_both_hosts(
        redis_client, run_id, tmp_path):
    params = _params(64, 5)
    FilesystemWeightPublisher(redis_client, tmp_path / "weights").publish(run_id=run_id, version=3, params=params)
    subscriber = RedisWeightSubscriber(redis_client)
    version, loaded = subscriber.fetch(run_id, params)  # this host sees the directory
    assert version == 3
    np.testing.assert_array_equal(np.asarray(loaded["kernel"][...]), np.asarray(params["kernel"][...]))

    # A producer host without the trainer's storage: the written path is not there.
    written = (tmp_path / "weights" / f"run-{run_id}" / "v3").resolve()
    written.rename(tmp_path / "elsewhere")
    with pytest.raises(WeightsNotVisibleError) as refused:
        subscriber.fetch(run_id, params)
    assert refused.value.path == str(written)
    assert refused.value.written_on == refused.value.read_on == socket.gethostname()
    assert str(written) in str(refused.value) and "weights.transport 'redis'" in str(refused.value)


def test_the_redis_transport_leaves_no_filesystem_pointer_behind(redis_client, run_id, tmp_path):
    params = _params(64, 6)
    FilesystemWeightPublisher(redis_client, tmp_path).publish(run_id=run_id, version=0, params=params)
    RedisWeightPublisher(redis_client).publish(run_id=run_id, version=1, params=params)
    assert not {b"path", b"written_on"} & set(redis_client.hkeys(weights_key(run_id)))
    assert RedisWeightSubscriber(redis_client).fetch(run_id, params)[0] == 1
