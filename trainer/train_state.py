"""The train state, the optimizer, and the state a run starts from: the structure its checkpoints restore into.

The trainer builds them once per run; a checkpoint export builds the same ones
(only their structure matters there) to restore a step into.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from policy import FrozenParam, Transformer, apply_lora, create_model, split_model
from tandem.configs.optimizer import OptimizerConfig
from tandem.configs.run import RunConfig
from trainer.value_head import with_value_head


@flax.struct.dataclass
class TrainState:
    """Everything the update changes; a pytree, so it can be donated and checkpointed."""

    # All model parameters, trained and frozen: the second half of
    # policy.model.split_model, so nnx.merge(graphdef, params) is the model.
    params: nnx.State
    # Optimizer state of the transformation the step was built with, over the
    # trained parameters only (see trainable_params).
    opt_state: optax.OptState
    # int32 scalar, number of updates applied.
    step: jax.Array


def trainable_params(params: nnx.State) -> tuple[nnx.State, nnx.State]:
    """``(trained, frozen)``: frozen are the weights LoRA keeps fixed (none without LoRA)."""
    frozen, trained = nnx.split_state(params, FrozenParam, ...)
    return trained, frozen


def create_train_state(
    model: Transformer, optimizer: optax.GradientTransformation
) -> tuple[nnx.GraphDef[Transformer], TrainState]:
    """Split ``model`` and initialize the optimizer on its trained parameters.

    The parameters are copied: the train step donates its state, and without
    a copy the first step would delete the arrays ``model`` still refers to.
    """
    graphdef, params = split_model(model)
    params = jax.tree.map(jnp.copy, params)
    trained, _ = trainable_params(params)
    state = TrainState(params=params, opt_state=optimizer.init(trained), step=jnp.int32(0))
    return graphdef, state


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
