"""Losses against hand computations (tolerance 1e-5 unless stated) and masking invariances."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trainer.losses import grpo_advantages, grpo_loss, sft_loss, token_logprobs
from trainer.train_step import TrainBatch

TOLERANCE = 1e-5


def _batch(tokens, loss_mask, advantages=None, behaviour_logprobs=None) -> TrainBatch:
    tokens = jnp.asarray(tokens, jnp.int32)
    batch_size, length = tokens.shape
    return TrainBatch(
        tokens=tokens,
        positions=jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch_size, length)),
        attention_mask=jnp.ones((batch_size, length), jnp.bool_),
        loss_mask=jnp.asarray(loss_mask, jnp.float32),
        advantages=(
            jnp.zeros((batch_size,)) if advantages is None else jnp.asarray(advantages, jnp.float32)
        ),
        behaviour_logprobs=(
            jnp.zeros((batch_size, length))
            if behaviour_logprobs is None
            else jnp.asarray(behaviour_logprobs, jnp.float32)
        ),
    )


def _logits_of(probabilities) -> jax.Array:
    """Logits whose softmax is exactly the given distributions."""
    return jnp.log(jnp.asarray(probabilities, jnp.float32))


# Distributions over V=3 with entropy 1.5 ln 2 each.
FIRST = [0.5, 0.25, 0.25]
SECOND = [0.25, 0.5, 0.25]
THIRD = [0.25, 0.25, 0.5]


def test_token_logprobs_gathers_the_log_softmax_of_each_target():
    logits = _logits_of([[FIRST, SECOND]])
    np.testing.assert_allclose(
        token_logprobs(logits, jnp.array([[1, 1]])),
        [[math.log(0.25), math.log(0.5)]],
        atol=TOLERANCE,
    )


def test_grpo_advantages_standardize_within_groups_over_valid_rows_only():
    rewards = jnp.array([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 5.0, 3.0, 1.0])
    group_ids = jnp.array([0, 0, 0, 0, 1, 1, 1, 2, 2], jnp.int32)
    valid = jnp.array([True, True, True, True, True, True, False, True, True])

    advantages = grpo_advantages(rewards, group_ids, valid, num_groups=3, eps=1e-6)

    # Group 0: mean 0.25, population std sqrt(0.1875) = 0.4330127.
    # Group 1: the invalid reward 5 is ignored, so the valid rewards {2, 2} have std 0.
    # Group 2: mean 2, population std 1.
    expected = [
        0.75 / (math.sqrt(0.1875) + 1e-6),  # 1.7320468
        -0.25 / (math.sqrt(0.1875) + 1e-6),  # -0.5773489
        -0.25 / (math.sqrt(0.1875) + 1e-6),
        -0.25 / (math.sqrt(0.1875) + 1e-6),
        0.0,
        0.0,
        0.0,  # invalid row
        1.0 / (1.0 + 1e-6),
        -1.0 / (1.0 + 1e-6),
    ]
    np.testing.assert_allclose(advantages, expected, atol=TOLERANCE)


def test_grpo_advantages_of_a_lone_valid_member_are_zero():
    advantages = grpo_advantages(
        jnp.array([7.0, 1.0]), jnp.array([0, 0], jnp.int32), jnp.array([True, False]), num_groups=1
    )
    np.testing.assert_allclose(advantages, [0.0, 0.0], atol=TOLERANCE)


def _grpo_example() -> tuple[jax.Array, TrainBatch]:
    """Five masked-in tokens covering every branch of the clipped objective (epsilon 0.2).

    Each predicted token has policy probability 0.5. Row 0 has advantage +1,
    row 1 advantage -2. Ratios and per-token objectives min(rA, clip(r)A):
      row 0 slot 1: r = 0.5/0.25 = 2.0, A>0, clipped high  -> 1.2
      row 0 slot 2: r = 0.5/0.5  = 1.0                     -> 1.0
      row 0 slot 3: r = 0.5/1.0  = 0.5, A>0, not clipped   -> 0.5
      row 1 slot 1: r = 0.5/1.0  = 0.5, A<0, clipped low   -> 0.8 * -2 = -1.6
      row 1 slot 2: r = 1.1,            inside the range   -> 1.1 * -2 = -2.2
      row 1 slot 3: loss mask 0 (a tool token); its behaviour log-prob -50 must not matter.
    """
    logits = _logits_of(
        [
            [FIRST, SECOND, THIRD, FIRST],
            [THIRD, FIRST, SECOND, SECOND],
        ]
    )
    batch = _batch(
        tokens=[[0, 0, 1, 2], [0, 2, 0, 1]],
        loss_mask=[[0, 1, 1, 1], [0, 1, 1, 0]],
        advantages=[1.0, -2.0],
        behaviour_logprobs=[
            [0.0, math.log(0.25), math.log(0.5), 0.0],
            [0.0, 0.0, math.log(0.5 / 1.1), -50.0],
        ],
    )
    return logits, batch


def test_grpo_loss_matches_a_hand_computation_with_clipping_on_both_sides():
    logits, batch = _grpo_example()

    loss, metrics = grpo_loss(logits, batch, clip_epsilon=0.2)

    # Token mean of the objectives: (1.2 + 1.0 + 0.5 - 1.6 - 2.2) / 5 = -0.22; loss is its negative.
    np.testing.assert_allclose(loss, 0.22, atol=TOLERANCE)
    np.testing.assert_allclose(metrics["clip_fraction"], 2 / 5, atol=TOLERANCE)
    np.testing.assert_allclose(
        metrics["ratio_mean"], (2.0 + 1.0 + 0.5 + 0.5 + 1.1) / 5, atol=TOLERANCE
    )
    np.testing.assert_allclose(metrics["entropy"], 1.5 * math.log(2), atol=TOLERANCE)
    np.testing.assert_allclose(metrics["num_tokens"], 5.0, atol=TOLERANCE)


def test_grpo_loss_gradient_vanishes_on_clipped_tokens():
    logits, batch = _grpo_example()
    grads = jax.grad(lambda x: grpo_loss(x, batch, clip_epsilon=0.2)[0])(logits)
    # Logits at slot 0 predict slot 1: clipped in both rows, so no gradient.
    np.testing.assert_allclose(grads[:, 0], 0.0, atol=TOLERANCE)
    # Unclipped tokens do get a gradient.
    assert float(jnp.abs(grads[0, 2]).sum()) > 1e-3
    assert float(jnp.abs(grads[1, 1]).sum()) > 1e-3


@pytest.mark.parametrize(
    "loss_fn", [functools.partial(grpo_loss, clip_epsilon=0.2), sft_loss], ids=["grpo", "sft"]
)
def test_tokens_outside_the_loss_mask_change_neither_loss_nor_gradient(loss_fn):
    logits, batch = _grpo_example()

    def loss_and_grad(logits, batch):
        return jax.value_and_grad(lambda x: loss_fn(x, batch)[0])(logits)

    loss, grads = loss_and_grad(logits, batch)

    # Row 1 slot 3 is a tool token: change it, and the logits that predict it (slot 2);
    # also the logits at each row's last slot, which predict nothing.
    edited_logits = logits.at[1, 2].set(jnp.array([3.0, -1.0, 0.5])).at[:, 3].set(7.0)
    edited_batch = batch.replace(
        tokens=batch.tokens.at[1, 3].set(2),
        behaviour_logprobs=batch.behaviour_logprobs.at[1, 3].set(-3.0),
    )
    edited_loss, edited_grads = loss_and_grad(edited_logits, edited_batch)
    np.testing.assert_allclose(edited_loss, loss, atol=TOLERANCE)
    np.testing.assert_allclose(edited_grads, grads, atol=TOLERANCE)
    np.testing.assert_allclose(edited_grads[1, 2], 0.0, atol=TOLERANCE)

    # A policy token (row 0 slot 3) does count.
    policy_edited = batch.replace(tokens=batch.tokens.at[0, 3].set(0))
    assert abs(float(loss_fn(logits, policy_edited)[0]) - float(loss)) > 1e-3


def test_sft_loss_matches_a_hand_computation():
    logits = _logits_of([[FIRST, THIRD, SECOND], [SECOND, SECOND, SECOND]])
    batch = _batch(
        tokens=[[0, 1, 2], [1, 1, 1]],
        # Row 1 is padding: it must not count at all.
        loss_mask=[[0, 1, 1], [0, 0, 0]],
    )

    loss, metrics = sft_loss(logits, batch)

    # Slot 1 (token 1) has p = 0.25, slot 2 (token 2) has p = 0.5: mean NLL (ln 4 + ln 2) / 2.
    np.testing.assert_allclose(loss, 1.5 * math.log(2), atol=TOLERANCE)
    # argmax predicts 0 for slot 1 (wrong) and 2 for slot 2 (right).
    np.testing.assert_allclose(metrics["token_accuracy"], 0.5, atol=TOLERANCE)
    np.testing.assert_allclose(metrics["num_tokens"], 2.0, atol=TOLERANCE)


def test_losses_are_zero_and_finite_on_a_batch_without_policy_tokens():
    logits, batch = _grpo_example()
    empty = batch.replace(loss_mask=jnp.zeros_like(batch.loss_mask))
    for loss_fn in (functools.partial(grpo_loss, clip_epsilon=0.2), sft_loss):
        loss, grads = jax.value_and_grad(lambda x, f=loss_fn: f(x, empty)[0])(logits)
        assert float(loss) == 0.0
        assert bool(jnp.all(grads == 0.0))
