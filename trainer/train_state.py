"""The optimizer and the train state a run starts from: the structure its checkpoints restore into.

The trainer builds them once per run; a checkpoint export builds the same ones
(only their structure matters there) to restore a step into.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from policy import apply_lora, create_model
from tandem.configs.optimizer import OptimizerConfig
from tandem.configs.run import RunConfig
from trainer.train_step import create_train_state
from trainer.value_head import with_value_head


def make_optimizer(learning_rate: float, optimizer: OptimizerConfig | None = None) -> optax.GradientTransformation:
    """Gradient clipping, then Adam or AdamW, as ``optimizer`` (default: OptimizerConfig()) says."""
    optimizer = optimizer or OptimizerConfig()

    def build(learning_rate):
        if optimizer.name == "adamw":
            update = optax.adamw(learning_rate, b1=optimizer.b1, b2=optimizer.b2, eps=optimizer.eps,
                                 weight_decay=optimizer.weight_decay)
        else:
            update = optax.adam(learning_rate, b1=optimizer.b1, b2=optimizer.b2, eps=optimizer.eps)
        return optax.chain(optax.clip_by_global_norm(optimizer.max_grad_norm), update)

    # The learning rate is a hyperparameter in the optimizer state, so the schedule
    # and the switch to the RL phase change it without a second optimizer or a recompile.
    return optax.inject_hyperparams(build)(learning_rate=learning_rate)


def set_learning_rate(state, rate: float) -> None:
    """Put ``rate`` in the optimizer state of :func:`make_optimizer` (a hyperparameter: no recompile), if it changed."""
    current = state.opt_state.hyperparams["learning_rate"]
    if np.isclose(float(current), rate, rtol=1e-6, atol=0.0):
        return
    value = np.asarray(rate, dtype=current.dtype)
    # Placed like the array it replaces, so the jitted step sees the same input sharding. Across
    # hosts, device_put would first check that every process passes the same value (a collective
    # of its own, made only where the rate changed); each process places its own copy instead.
    state.opt_state.hyperparams["learning_rate"] = (
        jax.device_put(jnp.asarray(value), current.sharding) if current.is_fully_addressable
        else jax.make_array_from_callback((), current.sharding, lambda index: value))


def initial_train_state(config: RunConfig, *, vocab_size: int, needs_value_head: bool,
                        optimizer: optax.GradientTransformation):
    """``(graphdef, train_state)`` a run starts from; also the structure its checkpoints restore into."""
    model = create_model(config.model, vocab_size=vocab_size, rngs=nnx.Rngs(config.seed))
    if config.lora.enabled:
        apply_lora(model, config.lora, rngs=nnx.Rngs(config.seed + 1))
    if needs_value_head:
        model = with_value_head(model, d_model=model.config.d_model, rngs=nnx.Rngs(config.seed + 2))
    return create_train_state(model, optimizer)
