"""Model factories shared by the trainer tests."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from trainer.model import Transformer, TransformerConfig, split_model

# Whole forward / decode calls compiled at once: far cheaper than op-by-op
# dispatch, which compiles every primitive for every new shape.
forward = nnx.jit(lambda model, tokens, positions, mask: model(tokens, positions, mask))
decode = nnx.jit(lambda model, *args: model.decode(*args))


def random_model(config: TransformerConfig, seed: int) -> Transformer:
    """A model with numpy-drawn weights: no compiled initializers (seconds per shape on CPU).

    Norm scales and biases are perturbed away from 1 and 0, so they matter.
    """
    graphdef, params = split_model(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0))))
    rng = np.random.default_rng(seed)

    def draw(path, leaf):
        name = path[-1].key
        if name == "scale":
            value = 1 + 0.2 * rng.standard_normal(leaf.shape)
        elif name == "bias":
            value = 0.5 * rng.standard_normal(leaf.shape)
        elif name == "embedding":
            value = rng.standard_normal(leaf.shape)
        else:
            value = rng.standard_normal(leaf.shape) / np.sqrt(leaf.shape[0])
        return jnp.asarray(value, leaf.dtype)

    nnx.replace_by_pure_dict(params, jax.tree.map_with_path(draw, nnx.to_pure_dict(params)))
    return nnx.merge(graphdef, params)




def drawn_train_state(run_config, seed: int):
    """The train state a run of ``run_config`` starts from, with every parameter drawn from ``seed``."""
    from trainer.run_loop import initial_train_state, make_optimizer
    from trainer.tokenizer import load_tokenizer

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
