"""The optimizer and learning-rate schedule of a run: validation, the rates by hand, and the real optimizer."""

import math

import jax.numpy as jnp
import optax
import pydantic
import pytest

from tandem.configs.optimizer import OptimizerConfig, ScheduleConfig
from tandem.configs.run import RunConfig
from trainer.train_state import make_optimizer


def test_the_default_schedule_keeps_each_phases_rate():
    schedule = ScheduleConfig()
    assert [schedule.learning_rate_at(base=0.1, step=step, total_steps=5) for step in range(5)] == [0.1] * 5


def test_warmup_rises_linearly_then_linear_decay_reaches_the_floor_on_the_last_step():
    schedule = ScheduleConfig(warmup_steps=2, decay="linear", min_ratio=0.1)
    rates = [schedule.learning_rate_at(base=1.0, step=step, total_steps=7) for step in range(7)]
    # Warm-up 0.5, 1.0; then five decay steps from 1.0 to the floor 0.1 in equal drops of 0.225.
    assert rates == pytest.approx([0.5, 1.0, 1.0, 0.775, 0.55, 0.325, 0.1])


def test_cosine_decay_follows_half_a_cosine():
    schedule = ScheduleConfig(decay="cosine")
    rates = [schedule.learning_rate_at(base=2.0, step=step, total_steps=5) for step in range(5)]
    expected = [2.0 * 0.5 * (1 + math.cos(math.pi * step / 4)) for step in range(5)]
    assert rates == pytest.approx(expected)
    assert rates[0] == 2.0 and rates[-1] == pytest.approx(0.0)


def test_weight_decay_needs_adamw_and_the_error_names_the_section():
    with pytest.raises(pydantic.ValidationError, match="weight_decay needs name 'adamw'"):
        RunConfig.model_validate({"optimizer": {"weight_decay": 0.01}})
    config = RunConfig.model_validate({"optimizer": {"name": "adamw", "weight_decay": 0.01},
                                       "schedule": {"warmup_steps": 10, "decay": "cosine"}})
    assert config.optimizer.weight_decay == 0.01 and config.schedule.decay == "cosine"
    with pytest.raises(pydantic.ValidationError):
        RunConfig.model_validate({"schedule": {"decay": "exponential"}})


def test_adamw_decays_weights_that_adam_leaves_alone():
    params = {"w": jnp.ones(3)}
    zero_gradient = {"w": jnp.zeros(3)}

    def one_update(optimizer: OptimizerConfig) -> jnp.ndarray:
        transform = make_optimizer(0.1, optimizer)
        updates, _ = transform.update(zero_gradient, transform.init(params), params)
        return optax.apply_updates(params, updates)["w"]

    assert jnp.allclose(one_update(OptimizerConfig()), 1.0)
    # AdamW: w - lr * weight_decay * w.
    assert jnp.allclose(one_update(OptimizerConfig(name="adamw", weight_decay=0.5)), 1.0 - 0.1 * 0.5)


def test_the_learning_rate_is_a_hyperparameter_the_schedule_can_change():
    transform = make_optimizer(0.1, OptimizerConfig(max_grad_norm=0.5))
    state = transform.init({"w": jnp.ones(2)})
    assert float(state.hyperparams["learning_rate"]) == pytest.approx(0.1)
