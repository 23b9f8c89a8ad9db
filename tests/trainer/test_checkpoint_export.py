"""Checkpoint lists under the run's retention policy, and the safetensors export of one checkpoint."""

from __future__ import annotations

import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from policy.hf import load_hf_checkpoint
from tandem.configs.run import RunConfig
from trainer.checkpoint_export import export_checkpoint
from trainer.checkpoints import RunCheckpointer

from .factories import save_checkpoints

RUN_CONFIG = {"model": {"d_model": 32, "num_layers": 2, "num_heads": 2, "mlp_dim": 64, "max_seq_len": 32},
              "checkpoint": {"kept": 2}}


def test_committed_checkpoints_follow_the_retention_policy(tmp_path: Path):
    config = RunConfig.model_validate(RUN_CONFIG)
    checkpointer = RunCheckpointer(tmp_path / "run-1", max_to_keep=config.checkpoint.kept)
    try:
        save_checkpoints(checkpointer, config, range(1, 3))
        first = checkpointer.committed_checkpoints()
        assert [(c.step, c.policy_version) for c in first] == [(1, 10), (2, 20)]
        save_checkpoints(checkpointer, config, range(3, 5))
        listed = checkpointer.committed_checkpoints()
    finally:
        checkpointer.close()
    assert [(c.step, c.policy_version) for c in listed] == [(3, 30), (4, 40)]
    assert not (tmp_path / "run-1" / "1").exists() and not (tmp_path / "run-1" / "2").exists()
    for checkpoint in listed:
        files = [path for path in Path(checkpoint.path).rglob("*") if path.is_file()]
        assert checkpoint.path == str((tmp_path / "run-1" / str(checkpoint.step)).resolve())
        assert checkpoint.size_bytes == sum(path.stat().st_size for path in files) > 0


def test_a_step_deleted_from_disk_is_no_longer_listed_and_retention_skips_it(tmp_path: Path):
    config = RunConfig.model_validate(RUN_CONFIG)
    checkpointer = RunCheckpointer(tmp_path / "run-1", max_to_keep=2)
    try:
        save_checkpoints(checkpointer, config, range(1, 3))
        shutil.rmtree(checkpointer.step_directory(1))
        assert [c.step for c in checkpointer.committed_checkpoints()] == [2]
        # Retention now removes step 1, which is already gone: saving goes on.
        save_checkpoints(checkpointer, config, range(3, 4))
        assert [c.step for c in checkpointer.committed_checkpoints()] == [2, 3]
    finally:
        checkpointer.close()


def test_export_writes_safetensors_that_load_back_with_equal_parameters(tmp_path: Path):
    config = RunConfig.model_validate(RUN_CONFIG)
    checkpointer = RunCheckpointer(tmp_path / "run-1", max_to_keep=3)
    try:
        states = save_checkpoints(checkpointer, config, range(1, 3))
    finally:
        checkpointer.close()
    files = export_checkpoint(RUN_CONFIG, run_directory=tmp_path / "run-1", step=1, destination=tmp_path / "hf")
    assert sorted(path.name for path in files) == ["config.json", "model.safetensors"]

    loaded = load_hf_checkpoint(tmp_path / "hf", param_dtype="float32", max_seq_len=32)
    loaded_params = nnx.to_pure_dict(nnx.state(loaded, nnx.Param))
    saved_params = nnx.to_pure_dict(states[1].params)
    saved_leaves = jax.tree.leaves_with_path(saved_params)
    loaded_leaves = dict(jax.tree.leaves_with_path(loaded_params))
    assert len(saved_leaves) == len(loaded_leaves)
    for path, value in saved_leaves:
        np.testing.assert_array_equal(np.asarray(loaded_leaves[path]), np.asarray(value), err_msg=str(path))
    # Step 2's parameters differ, so equality above says step 1 was the one exported.
    first, second = (jax.tree.leaves(states[step].params)[0] for step in (1, 2))
    assert not jnp.array_equal(first, second)
