"""Checkpoints: a run killed after a checkpoint resumes exactly, and saving does not stall the loop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from policy.model import Transformer, TransformerConfig
from trainer.checkpoints import RunCheckpointer, RunProgress, step_rng
from trainer.losses import sft_loss
from trainer.train_batch import pad_batch
from trainer.train_state import create_train_state
from trainer.train_step import make_train_step, on_token_statistics

REPO_ROOT = Path(__file__).resolve().parents[2]
SEED = 7
CONFIG = TransformerConfig(
    vocab_size=64, d_model=32, num_layers=2, num_heads=2, mlp_dim=64, max_seq_len=32
)
KILLED_AFTER_STEP = 2
TOTAL_STEPS = 4


def _optimizer() -> optax.GradientTransformation:
    # As the run loop builds it: the learning rate lives in the optimizer state.
    return optax.inject_hyperparams(
        lambda learning_rate: optax.chain(optax.clip_by_global_norm(1.0), optax.adam(learning_rate))
    )(learning_rate=1e-2)


def _batch(step: int):
    """The batch of ``step``, drawn from an RNG keyed by (seed, step), as a resumed run needs."""
    rng = step_rng(SEED, step)
    sequences = [[rng.randrange(1, 64) for _ in range(rng.randrange(6, 16))] for _ in range(4)]
    return pad_batch(sequences, loss_masks=[[0] + [1] * (len(s) - 1) for s in sequences],
                     behaviour_logprobs=None, advantages=None, batch_size=4,
                     length_buckets=(16,), pad_id=0)


def _fresh(optimizer):
    return create_train_state(Transformer(CONFIG, rngs=nnx.Rngs(SEED)), optimizer)


def _progress(step: int) -> RunProgress:
    return RunProgress(
        step=step, policy_version=step - 1, run_id=42,
        last_acked_entry_id=f"1700000000000-{step}",
        trained_group_ids=[f"group-{index}" for index in range(2 * step)],
    )


def _train_then_hang(directory: Path) -> None:
    """Child process: train, checkpoint, wait for the commit, say so, and wait to be killed."""
    optimizer = _optimizer()
    graphdef, state = _fresh(optimizer)
    train_step = make_train_step(graphdef, optimizer, on_token_statistics(sft_loss))
    for step in range(KILLED_AFTER_STEP):
        state, _ = train_step(state, _batch(step))
    checkpointer = RunCheckpointer(directory)
    checkpointer.save(KILLED_AFTER_STEP, train_state=state, progress=_progress(KILLED_AFTER_STEP))
    checkpointer.wait_until_finished()
    print("committed", flush=True)
    # As a trainer waiting for its stream would, until SIGKILL; no clean shutdown.
    while True:
        time.sleep(1)


def test_a_run_killed_after_a_checkpoint_resumes_to_the_same_parameters(tmp_path):
    directory = tmp_path / "run-42"
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.trainer.test_checkpoints", str(directory)],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    try:
        # The uninterrupted run, while the child trains.
        optimizer = _optimizer()
        graphdef, straight = _fresh(optimizer)
        train_step = make_train_step(graphdef, optimizer, on_token_statistics(sft_loss))
        for step in range(TOTAL_STEPS):
            straight, _ = train_step(straight, _batch(step))
        line = child.stdout.readline()
        assert line.strip() == "committed", child.stderr.read()[-4000:]
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL

    _, template = _fresh(optimizer)
    checkpointer = RunCheckpointer(directory)
    restored = checkpointer.restore_latest(template)
    assert restored is not None
    resumed, progress = restored
    assert progress.step == int(resumed.step) == KILLED_AFTER_STEP
    assert progress == _progress(progress.step)
    assert progress.trained_group_count == 2 * progress.step
    for step in range(progress.step, TOTAL_STEPS):
        resumed, _ = train_step(resumed, _batch(step))
    checkpointer.close()

    assert int(resumed.step) == TOTAL_STEPS
    straight_leaves = jax.tree_util.tree_leaves_with_path(straight)
    resumed_leaves = jax.tree.leaves(resumed)
    assert len(straight_leaves) == len(resumed_leaves)
    for (path, expected), actual in zip(straight_leaves, resumed_leaves, strict=True):
        # Bitwise: same program, same inputs, same machine, even in another process.
        np.testing.assert_array_equal(np.asarray(actual), np.asarray(expected),
                                      err_msg=jax.tree_util.keystr(path))


def test_restore_latest_without_checkpoints_is_none(tmp_path):
    _, template = _fresh(_optimizer())
    assert RunCheckpointer(tmp_path / "empty").restore_latest(template) is None


def test_save_blocks_only_for_the_host_copy_and_a_donating_step_cannot_corrupt_it(tmp_path):
    # About 80 MB of train state (parameters and two Adam moments), so disk time is visible.
    config = TransformerConfig(vocab_size=256, d_model=512, num_layers=2, num_heads=4,
                               mlp_dim=1536, max_seq_len=32)
    optimizer = _optimizer()
    graphdef, state = create_train_state(Transformer(config, rngs=nnx.Rngs(0)), optimizer)
    train_step = make_train_step(graphdef, optimizer, on_token_statistics(sft_loss))
    state, _ = train_step(state, _batch(0))
    jax.block_until_ready(state)
    saved = jax.tree.map(np.array, state)
    state_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(saved))

    checkpointer = RunCheckpointer(tmp_path / "run")
    started = time.perf_counter()
    blocking_s = checkpointer.save(1, train_state=state, progress=RunProgress(step=1))
    # Donating steps while the write is in flight.
    for step in range(1, 3):
        state, _ = train_step(state, _batch(step))
    jax.block_until_ready(state)
    checkpointer.wait_until_finished()
    total_s = time.perf_counter() - started
    print(json.dumps({"state_mb": round(state_bytes / 2**20, 1), "save_blocking_s": round(blocking_s, 4),
                      "save_total_s": round(total_s, 4)}))

    assert blocking_s < 0.5 * total_s, (blocking_s, total_s)
    restored, progress = checkpointer.restore(1, abstract_train_state=state)
    checkpointer.close()
    assert progress.step == 1
    for expected, actual in zip(jax.tree.leaves(saved), jax.tree.leaves(restored), strict=True):
        np.testing.assert_array_equal(np.asarray(actual), expected)
    assert not bool(jnp.array_equal(restored.step, state.step))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        pytest.exit("usage: python -m tests.trainer.test_checkpoints <checkpoint dir>")
    _train_then_hang(Path(sys.argv[1]))
