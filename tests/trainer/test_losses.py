"""Losses against hand computations (tolerance 1e-5 unless stated) and masking invariances."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trainer import losses
from trainer.losses import (
    aggregate_loss,
    clipped_value_loss,
    grpo_advantages,
    kl_estimate,
    token_logprobs,
    truncated_importance_weights,
)
from trainer.token_statistics import logits_token_statistics
from trainer.train_batch import TrainBatch

TOLERANCE = 1e-5


# The losses read token statistics; these tests state their cases as logits [B, T, V], which is what
# the statistics come from (trainer/token_statistics.py checks the chunked path gives the same).
def grpo_loss(logits, batch, **options):
    return losses.grpo_loss(logits_token_statistics(logits, batch.tokens), batch, **options)


def policy_gradient_loss(logits, batch, **options):
    return losses.policy_gradient_loss(logits_token_statistics(logits, batch.tokens), batch, **options)


def sft_loss(logits, batch):
    return losses.sft_loss(logits_token_statistics(logits, batch.tokens), batch)


def _batch(tokens, loss_mask, advantages=None, behaviour_logprobs=None, extras=None) -> TrainBatch:
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
        extras={key: jnp.asarray(value, jnp.float32) for key, value in (extras or {}).items()},
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


# -- aggregation modes -------------------------------------------------------

AGGREGATION_VALUES = jnp.array([[1.0, 2.0, 3.0, 0.0], [4.0, 0.0, 0.0, 0.0], [9.0, 9.0, 9.0, 9.0]])
# Row 0 has 3 policy tokens, row 1 has 1, row 2 is padding (its 9s must not count).
AGGREGATION_MASK = jnp.array([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        # (1 + 2 + 3 + 4) / 4 tokens.
        ("token_mean", 2.5),
        # Row means 2 and 4, averaged over the 2 rows that have tokens.
        ("seq_mean_token_mean", 3.0),
        # Sum 10 / (token_sum_length 5 x 2 rows that have tokens).
        ("token_sum", 1.0),
    ],
)
def test_each_aggregation_mode_matches_a_hand_computation(mode, expected):
    loss = aggregate_loss(AGGREGATION_VALUES, AGGREGATION_MASK, mode, token_sum_length=5)
    np.testing.assert_allclose(loss, expected, atol=TOLERANCE)


def test_token_sum_needs_its_length_and_an_empty_mask_aggregates_to_zero():
    with pytest.raises(ValueError, match="token_sum_length"):
        aggregate_loss(AGGREGATION_VALUES, AGGREGATION_MASK, "token_sum")
    for mode in ("token_mean", "seq_mean_token_mean", "token_sum"):
        empty = aggregate_loss(
            AGGREGATION_VALUES, jnp.zeros_like(AGGREGATION_MASK), mode, token_sum_length=5
        )
        assert float(empty) == 0.0


@pytest.mark.parametrize(
    ("mode", "expected_loss"),
    [
        ("token_mean", 0.22),
        # Row means (1.2 + 1.0 + 0.5) / 3 = 0.9 and (-1.6 - 2.2) / 2 = -1.9; mean -0.5.
        ("seq_mean_token_mean", 0.5),
        # Sum -1.1 / (4 x 2 rows).
        ("token_sum", 0.1375),
    ],
)
def test_policy_loss_aggregates_the_clipped_objective_by_the_chosen_mode(mode, expected_loss):
    logits, batch = _grpo_example()
    loss, metrics = policy_gradient_loss(
        logits, batch, epsilon_low=0.2, epsilon_high=0.2, aggregation=mode, token_sum_length=4
    )
    np.testing.assert_allclose(loss, expected_loss, atol=TOLERANCE)
    np.testing.assert_allclose(metrics["policy_loss"], expected_loss, atol=TOLERANCE)


# -- asymmetric clipping (DAPO clip-higher) ----------------------------------


def _asymmetric_example() -> tuple[jax.Array, TrainBatch]:
    """Every predicted token has policy probability 0.5; behaviour probs set the ratios.

    Row 0 (A = +1): ratios 1.25, 1.3, 0.75. Row 1 (A = -1): ratios 0.75, 1.3.
    """
    logits = _logits_of([[FIRST, SECOND, THIRD, FIRST], [THIRD, FIRST, SECOND, FIRST]])
    batch = _batch(
        tokens=[[0, 0, 1, 2], [0, 2, 0, 1]],
        loss_mask=[[0, 1, 1, 1], [0, 1, 1, 0]],
        advantages=[1.0, -1.0],
        behaviour_logprobs=[
            [0.0, math.log(0.5 / 1.25), math.log(0.5 / 1.3), math.log(0.5 / 0.75)],
            [0.0, math.log(0.5 / 0.75), math.log(0.5 / 1.3), 0.0],
        ],
    )
    return logits, batch


def test_asymmetric_clipping_clips_each_side_at_its_own_epsilon():
    logits, batch = _asymmetric_example()

    loss, metrics = policy_gradient_loss(logits, batch, epsilon_low=0.2, epsilon_high=0.28)

    # min(rA, clip(r, 0.8, 1.28) A) per token:
    #   A=+1: r=1.25 -> 1.25 (a symmetric 0.2 clip would give 1.2); r=1.3 -> 1.28 (clipped high);
    #         r=0.75 -> 0.75 (below the range, but A > 0: the min keeps the unclipped term)
    #   A=-1: r=0.75 -> -0.8 (clipped low); r=1.3 -> -1.3 (above the range, A < 0: unclipped)
    # Token mean: (1.25 + 1.28 + 0.75 - 0.8 - 1.3) / 5 = 0.236; the loss is its negative.
    np.testing.assert_allclose(loss, -0.236, atol=TOLERANCE)
    np.testing.assert_allclose(metrics["clip_fraction_high"], 1 / 5, atol=TOLERANCE)
    np.testing.assert_allclose(metrics["clip_fraction_low"], 1 / 5, atol=TOLERANCE)
    np.testing.assert_allclose(metrics["clip_fraction"], 2 / 5, atol=TOLERANCE)
    np.testing.assert_allclose(metrics["ratio_mean"], 5.35 / 5, atol=TOLERANCE)

    # The same tokens with a symmetric 0.2: r=1.25 is now clipped too, at 1.2.
    symmetric_loss, symmetric = policy_gradient_loss(
        logits, batch, epsilon_low=0.2, epsilon_high=0.2
    )
    np.testing.assert_allclose(symmetric_loss, -(1.2 + 1.2 + 0.75 - 0.8 - 1.3) / 5, atol=TOLERANCE)
    np.testing.assert_allclose(symmetric["clip_fraction_high"], 2 / 5, atol=TOLERANCE)


def test_asymmetric_clipping_zeroes_the_gradient_of_exactly_the_clipped_tokens():
    logits, batch = _asymmetric_example()
    grads = jax.grad(
        lambda x: policy_gradient_loss(x, batch, epsilon_low=0.2, epsilon_high=0.28)[0]
    )(logits)
    # Logits at slot t predict slot t + 1. Clipped: row 0 slot 2 (high), row 1 slot 1 (low).
    np.testing.assert_allclose(grads[0, 1], 0.0, atol=TOLERANCE)
    np.testing.assert_allclose(grads[1, 0], 0.0, atol=TOLERANCE)
    for row, slot in [(0, 0), (0, 2), (1, 1)]:
        assert float(jnp.abs(grads[row, slot]).sum()) > 1e-3, (row, slot)


# -- KL penalty ----------------------------------------------------------------

# Reference log-probs for _grpo_example, whose policy log-prob is ln 0.5 on every token:
# d = ref - logp is ln 0.5, 0, ln 2 on row 0 and ln 0.5, ln 1.5 on row 1.
REFERENCE = [
    [0.0, math.log(0.25), math.log(0.5), math.log(1.0)],
    [0.0, math.log(0.25), math.log(0.75), -7.0],  # slot 3 is a tool token: ignored
]
D = [math.log(0.5), 0.0, math.log(2.0), math.log(0.5), math.log(1.5)]


def test_k1_and_k3_estimators_match_a_hand_computation():
    policy = jnp.full((2, 3), math.log(0.5))
    reference = jnp.array([REFERENCE[0][1:], REFERENCE[1][1:]])
    mask = jnp.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])

    k1 = kl_estimate(policy, reference, mask, "k1")
    k3 = kl_estimate(policy, reference, mask, "k3")

    # k1 = logp - ref = -d; k3 = e^d - d - 1 (e.g. d = ln 2: 2 - ln 2 - 1 = 0.3068528).
    np.testing.assert_allclose(k1, [[-D[0], -D[1], -D[2]], [-D[3], -D[4], 0.0]], atol=TOLERANCE)
    k3_expected = [math.exp(d) - d - 1 for d in D]
    np.testing.assert_allclose(k3, [k3_expected[:3], [*k3_expected[3:], 0.0]], atol=TOLERANCE)
    assert bool(jnp.all(k3 >= 0.0))


@pytest.mark.parametrize("estimator", ["k1", "k3"])
def test_kl_penalty_adds_its_coefficient_times_the_mean_estimate_to_the_loss(estimator):
    logits, batch = _grpo_example()
    batch = batch.replace(extras={"reference_logprobs": jnp.asarray(REFERENCE)})

    loss, metrics = policy_gradient_loss(
        logits, batch, epsilon_low=0.2, epsilon_high=0.2, kl_coef=0.1, kl_estimator=estimator
    )

    # k1: ln(4/3) / 5 = 0.0575364; k3: 0.1575371.
    k1_mean, k3_mean = -sum(D) / 5, sum(math.exp(d) - d - 1 for d in D) / 5
    kl_mean = k1_mean if estimator == "k1" else k3_mean
    np.testing.assert_allclose(metrics["kl"], kl_mean, atol=TOLERANCE)
    np.testing.assert_allclose(loss, 0.22 + 0.1 * kl_mean, atol=TOLERANCE)
    np.testing.assert_allclose(metrics["policy_loss"], 0.22, atol=TOLERANCE)


def test_k3_penalty_has_no_gradient_where_policy_and_reference_agree():
    logits, batch = _grpo_example()
    policy_logprobs = jnp.pad(token_logprobs(logits[:, :-1], batch.tokens[:, 1:]), ((0, 0), (1, 0)))
    batch = batch.replace(extras={"reference_logprobs": policy_logprobs})

    def kl_part(x):
        loss, metrics = policy_gradient_loss(
            x, batch, epsilon_low=0.2, epsilon_high=0.2, kl_coef=1.0, kl_estimator="k3"
        )
        return loss - metrics["policy_loss"]

    value, grads = jax.value_and_grad(kl_part)(logits)
    np.testing.assert_allclose(value, 0.0, atol=TOLERANCE)
    np.testing.assert_allclose(grads, 0.0, atol=TOLERANCE)


# -- truncated importance sampling -------------------------------------------
# In _grpo_example the proximal (current) policy gives every predicted token
# probability 0.5, so the proximal/behaviour ratios are 2, 1, 0.5 (row 0, A = +1)
# and 0.5, 1.1 (row 1, A = -2).


def test_token_level_tis_weights_each_token_by_its_truncated_ratio():
    logits, batch = _grpo_example()

    loss, metrics = policy_gradient_loss(
        logits,
        batch,
        epsilon_low=0.2,
        epsilon_high=0.2,
        importance_sampling="token",
        importance_sampling_cap=1.5,
    )

    # The PPO ratio is against the proximal policy, 1 in value, so nothing is clipped;
    # weights min(ratio, 1.5) = 1.5, 1, 0.5, 0.5, 1.1.
    # Objective: (1.5 + 1 + 0.5) * 1 + (0.5 + 1.1) * -2 = -0.2; token mean -0.04.
    np.testing.assert_allclose(loss, 0.04, atol=TOLERANCE)
    np.testing.assert_allclose(metrics["clip_fraction"], 0.0, atol=TOLERANCE)
    np.testing.assert_allclose(metrics["ratio_mean"], 1.0, atol=TOLERANCE)
    np.testing.assert_allclose(metrics["tis_ratio_mean"], 5.1 / 5, atol=TOLERANCE)
    np.testing.assert_allclose(metrics["tis_ratio_min"], 0.5, atol=TOLERANCE)
    np.testing.assert_allclose(metrics["tis_ratio_max"], 2.0, atol=TOLERANCE)
    np.testing.assert_allclose(metrics["tis_truncated_fraction"], 1 / 5, atol=TOLERANCE)
    np.testing.assert_allclose(metrics["tis_weight_mean"], 4.6 / 5, atol=TOLERANCE)


def test_tis_gradient_is_the_weighted_policy_gradient():
    logits, batch = _grpo_example()
    mask = batch.loss_mask[:, 1:]
    weights = jnp.array([[1.5, 1.0, 0.5], [0.5, 1.1, 0.0]])

    def tis_loss(x):
        return policy_gradient_loss(
            x,
            batch,
            epsilon_low=0.2,
            epsilon_high=0.2,
            importance_sampling="token",
            importance_sampling_cap=1.5,
        )[0]

    def reinforce(x):
        # -(1/5) sum w A log pi, with w constant.
        logprobs = token_logprobs(x[:, :-1], batch.tokens[:, 1:])
        return -jnp.sum(weights * batch.advantages[:, None] * logprobs * mask) / 5

    np.testing.assert_allclose(
        jax.grad(tis_loss)(logits), jax.grad(reinforce)(logits), atol=TOLERANCE
    )


def test_sequence_level_tis_weights_each_episode_by_its_truncated_product_of_ratios():
    logits, batch = _grpo_example()

    loss, metrics = policy_gradient_loss(
        logits,
        batch,
        epsilon_low=0.2,
        epsilon_high=0.2,
        importance_sampling="sequence",
        importance_sampling_cap=0.9,
    )

    # Row 0: 2 x 1 x 0.5 = 1, truncated to 0.9. Row 1: 0.5 x 1.1 = 0.55.
    # Objective: 0.9 x 3 x (+1) + 0.55 x 2 x (-2) = 0.5; token mean 0.1.
    np.testing.assert_allclose(loss, -0.1, atol=TOLERANCE)
    np.testing.assert_allclose(metrics["tis_ratio_mean"], (1.0 + 0.55) / 2, atol=TOLERANCE)
    np.testing.assert_allclose(metrics["tis_ratio_min"], 0.55, atol=TOLERANCE)
    np.testing.assert_allclose(metrics["tis_ratio_max"], 1.0, atol=TOLERANCE)
    np.testing.assert_allclose(metrics["tis_truncated_fraction"], 1 / 2, atol=TOLERANCE)
    np.testing.assert_allclose(metrics["tis_weight_mean"], (0.9 + 0.55) / 2, atol=TOLERANCE)


def test_tis_weights_ignore_padding_and_stay_finite_for_huge_ratios():
    proximal = jnp.array([[0.0, 0.0], [0.0, 0.0]])
    behaviour = jnp.array([[-200.0, -200.0], [0.0, -1e4]])  # ratios e^200 each; row 1 masked
    mask = jnp.array([[1.0, 1.0], [0.0, 0.0]])
    for level in ("token", "sequence"):
        weights, metrics = truncated_importance_weights(
            proximal, behaviour, mask, level=level, cap=3.0
        )
        np.testing.assert_allclose(weights, [[3.0, 3.0], [0.0, 0.0]], atol=TOLERANCE)
        assert all(bool(jnp.isfinite(value)) for value in metrics.values())
        np.testing.assert_allclose(metrics["tis_truncated_fraction"], 1.0, atol=TOLERANCE)


# -- PPO value loss ------------------------------------------------------------


def test_clipped_value_loss_matches_a_hand_computation():
    values = jnp.array([1.0, 0.5, 0.0, 1.0])
    old_values = jnp.array([0.8, 0.5, 0.3, 0.5])
    returns = jnp.array([1.5, 0.0, 1.0, 1.0])

    loss = clipped_value_loss(values, old_values, returns, clip=0.2)

    # 0.5 * max((V - R)^2, (old + clip(V - old, +-0.2) - R)^2):
    #   V=1.0 old=0.8: clipped 1.0, both (1 - 1.5)^2 = 0.25          -> 0.125
    #   V=0.5 old=0.5: clipped 0.5, (0.5 - 0)^2 = 0.25                -> 0.125
    #   V=0.0 old=0.3: clipped 0.1; 1.0 vs 0.81, unclipped is larger  -> 0.5
    #   V=1.0 old=0.5: clipped 0.7; 0.0 vs 0.09, clipped is larger    -> 0.045
    np.testing.assert_allclose(loss, [0.125, 0.125, 0.5, 0.045], atol=TOLERANCE)
