"""Train states and committed checkpoints drawn for the checkpoint tests."""

from __future__ import annotations

import jax


def drawn_train_state(run_config, seed: int):
    """The train state a run of ``run_config`` starts from, with every parameter drawn from ``seed``."""
    from policy.tokenizer import load_tokenizer
    from trainer.train_state import initial_train_state, make_optimizer

    _, state = initial_train_state(run_config, vocab_size=load_tokenizer(run_config.model.tokenizer).vocab_size,
                                   needs_value_head=False, optimizer=make_optimizer(run_config.learning_rate, run_config.optimizer))
    keys = iter(jax.random.split(jax.random.key(seed), len(jax.tree.leaves(state.params))))
    params = jax.tree.map(lambda leaf: jax.random.normal(next(keys), leaf.shape, leaf.dtype), state.params)
    return state.replace(params=params)


def save_checkpoints(checkpointer, run_config, steps) -> dict:
    """Commit a checkpoint of a drawn state per step (policy version: 10 x step); returns the states."""
    from trainer.checkpoints import RunProgress

    states = {}
    for step in steps:
        states[step] = drawn_train_state(run_config, seed=step)
        checkpointer.save(step, train_state=states[step], progress=RunProgress(step=step, policy_version=step * 10))
        checkpointer.wait_until_finished()
    return states
