"""The filesystem weight transport: Orbax checkpoints on a shared path, a pointer in Redis."""

import socket

import jax
import numpy as np
from flax import nnx

from policy.model import Transformer, TransformerConfig, split_model
from policy.tokenizer import VOCAB_SIZE
from policy.weights import FilesystemWeightPublisher, RedisWeightSubscriber
from tandem.configs.run import ModelConfig, RunConfig
from workers.policy import PolicyRuntime

MODEL = ModelConfig(d_model=32, num_layers=1, num_heads=2, mlp_dim=64, max_seq_len=64)


def _params(seed: int):
    model = Transformer(TransformerConfig.from_model_config(MODEL, VOCAB_SIZE), rngs=nnx.Rngs(seed))
    return split_model(model)[1]


def _leaves(params):
    return [np.asarray(leaf) for leaf in jax.tree.leaves(params)]


def test_producers_follow_the_pointer_to_the_newest_checkpoint(redis_client, run_id, tmp_path):
    publisher = FilesystemWeightPublisher(redis_client, tmp_path, keep=2)
    subscriber = RedisWeightSubscriber(redis_client)
    like = _params(0)
    for version, seed in enumerate((1, 2, 3)):
        written = publisher.publish(run_id=run_id, version=version, params=_params(seed))
        assert written > 0
    version, params = subscriber.fetch(run_id, like)
    assert version == 2
    for ours, theirs in zip(_leaves(params), _leaves(_params(3)), strict=True):
        np.testing.assert_array_equal(ours, theirs)
    # Only the newest `keep` versions stay on disk.
    assert sorted(p.name for p in (tmp_path / f"run-{run_id}").iterdir()) == ["v1", "v2"]
    # Redis holds a pointer, not the weights.
    assert set(redis_client.hkeys(f"tandem:run:{run_id}:weights")) == {b"version", b"path", b"written_on"}
    # The host that wrote it, for the error of a producer host that cannot see the path.
    assert redis_client.hget(f"tandem:run:{run_id}:weights", "written_on").decode() == socket.gethostname()


def test_a_producer_runtime_loads_weights_published_on_the_filesystem(redis_client, run_id, tmp_path):
    FilesystemWeightPublisher(redis_client, tmp_path).publish(run_id=run_id, version=5, params=_params(4))
    runtime = PolicyRuntime(run_id=run_id, config=RunConfig(model=MODEL), redis_client=redis_client)
    try:
        assert runtime.refresh_weights(force=True) == 5
        for ours, theirs in zip(_leaves(runtime.params), _leaves(_params(4)), strict=True):
            np.testing.assert_array_equal(ours, theirs)
    finally:
        runtime.close()
