"""Losses of the SFT and RL phases, as pure jnp functions of the policy's per-token statistics.

Every loss reads the policy through a :class:`~trainer.token_statistics.TokenStatistics`: the
log-prob, entropy and argmax hit of each predicted token, which the train step computes from the
model's hidden states in chunks, never as ``[B, T, V]`` logits. They share one shift convention:
slot ``t`` of the statistics is about the token at slot ``t + 1``, so the per-token inputs
(``loss_mask``, ``behaviour_logprobs``, and the per-token extras such as
``extras["reference_logprobs"]`` or ``extras["token_rewards"]``) are read at the predicted token's
slot, ``[:, 1:]``. A loss mask of 1 marks tokens the policy generated; prompt, environment and tool
tokens (and padding) have 0 and contribute neither loss nor gradient.

How per-token losses become one number is the aggregation mode
(:func:`aggregate_loss`): ``token_mean`` (the default, so a long episode
weighs in proportion to its tokens), ``seq_mean_token_mean`` or
``token_sum``. Padding rows weigh nothing in any of them.

**Micro-batches.** Every loss divides by :class:`StepTotals`, counted over the whole step, not over
the rows it is given: so the losses (and the gradients) of a step's micro-batches add up to the
step's, and so do its metrics. Metrics are means over policy tokens (or episodes) unless their name
ends in ``_min`` or ``_max``; :func:`combine_metrics` adds up the micro-batches' and takes the
extremes of those two.

Every loss returns ``(scalar loss, dict of scalar metrics)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import flax.struct
import jax
import jax.numpy as jnp

from trainer.advantages import gae_advantages, grpo_advantages
from trainer.token_statistics import TokenStatistics
from trainer.train_batch import TrainBatch

__all__ = [
    "LossFn",
    "PPOTargets",
    "StepTotals",
    "aggregate_loss",
    "clipped_value_loss",
    "combine_metrics",
    "finish_metrics",
    "grpo_advantages",
    "grpo_loss",
    "kl_estimate",
    "policy_gradient_loss",
    "ppo_loss",
    "ppo_targets",
    "sft_loss",
    "step_totals",
    "token_logprobs",
    "truncated_importance_weights",
]

Aggregation = Literal["token_mean", "seq_mean_token_mean", "token_sum"]

# Sequence-level importance ratios are products over hundreds of tokens; their
# statistics are reported from log-ratios capped here so that they stay finite.
_MAX_REPORTED_LOG_RATIO = 80.0


@flax.struct.dataclass
class StepTotals:
    """What the losses divide by, counted over a whole step (all its micro-batches)."""

    # float32 scalar: the step's policy tokens (loss_mask[:, 1:]), at least 1.
    policy_tokens: jax.Array
    # float32 scalar: the step's rows with a policy token, at least 1.
    sequences: jax.Array


def step_totals(batch: TrainBatch) -> StepTotals:
    """The totals of ``batch`` taken as a whole step."""
    return step_totals_of_mask(batch.loss_mask[:, 1:], episode_membership(batch))


def episode_membership(batch: TrainBatch) -> jax.Array | None:
    """float32 [B, T - 1, K]: 1 where the predicted token at a slot belongs to its row's ``k + 1``-th
    episode; None where each row is one episode (an unpacked batch)."""
    if batch.episodes is None:
        return None
    slots = batch.advantages.shape[1]
    return (batch.episodes[:, 1:, None] == jnp.arange(1, slots + 1, dtype=jnp.int32)).astype(jnp.float32)


def _per_episode_sum(values: jax.Array, membership: jax.Array | None) -> jax.Array:
    """[B, L] -> [B, K]: each episode's sum (K = 1, the row's, without ``membership``)."""
    if membership is None:
        return jnp.sum(values, axis=-1, keepdims=True)
    return jnp.einsum("blk,bl->bk", membership, values)


def _per_token(per_episode: jax.Array, membership: jax.Array | None) -> jax.Array:
    """[B, K] -> [B, L] (or [B, 1] to broadcast, without ``membership``): each token its episode's value."""
    if membership is None:
        return per_episode
    return jnp.einsum("blk,bk->bl", membership, per_episode)


# A loss maps the policy's token statistics [B, T - 1], the batch they came from and the step's
# totals to (scalar loss, scalar metrics). The train step differentiates the loss only.
LossFn = Callable[[TokenStatistics, TrainBatch, StepTotals], tuple[jax.Array, dict[str, jax.Array]]]


def combine_metrics(per_micro_batch: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """One step's metrics from its micro-batches' (each stacked on a leading axis): ``_min`` and ``_max``
    metrics by their extremes, every other (already divided by the step's totals) by its sum."""
    combined = {}
    for name, values in per_micro_batch.items():
        if name.endswith("_min"):
            combined[name] = jnp.min(values, axis=0)
        elif name.endswith("_max"):
            combined[name] = jnp.max(values, axis=0)
        else:
            combined[name] = jnp.sum(values, axis=0)
    return combined


def finish_metrics(metrics: dict[str, jax.Array]) -> dict[str, jax.Array]:
    """The step's metrics as reported: a ``_min`` or ``_max`` over nothing (infinite) is 0."""
    return {name: jnp.where(jnp.isfinite(value), value, 0.0) if name.endswith(("_min", "_max")) else value
            for name, value in metrics.items()}


def token_logprobs(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """log p(targets[b, t]) under softmax(logits[b, t]); [B, T, V], [B, T] -> [B, T]."""
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(log_probs, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]


def _policy_mask(batch: TrainBatch) -> jax.Array:
    """The loss mask of the predicted tokens, float32 [B, T - 1]."""
    return batch.loss_mask[:, 1:].astype(jnp.float32)


def _masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def _step_mean(values: jax.Array, mask: jax.Array, total: jax.Array) -> jax.Array:
    """``values``' share of the mean over the whole step: their sum over ``mask`` over the step's ``total``."""
    return jnp.sum(values * mask) / total


def _masked_variance(values: jax.Array, mask: jax.Array) -> jax.Array:
    return _masked_mean((values - _masked_mean(values, mask)) ** 2, mask)


def _masked_min_max(values: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Min and max over ``mask``; infinite when the mask is empty (:func:`finish_metrics` reports 0)."""
    selected = mask > 0
    return jnp.min(jnp.where(selected, values, jnp.inf)), jnp.max(jnp.where(selected, values, -jnp.inf))


def aggregate_loss(
    per_token: jax.Array,
    mask: jax.Array,
    mode: Aggregation,
    *,
    token_sum_length: int | None = None,
    totals: StepTotals | None = None,
    membership: jax.Array | None = None,
) -> jax.Array:
    """Reduce a per-token loss [B, L] over the policy tokens in ``mask`` [B, L] to a scalar.

    Modes (``n_b`` = policy tokens of row ``b``, ``N`` = rows with ``n_b > 0``):

    - ``token_mean``: ``sum_b,t loss * mask / sum_b n_b``. Every token of the
      batch weighs the same (DAPO's token-level loss).
    - ``seq_mean_token_mean``: ``(1 / N) sum_b (sum_t loss * mask) / n_b``.
      Every episode weighs the same, so tokens of short episodes weigh more
      (original GRPO).
    - ``token_sum``: ``sum_b,t loss * mask / (token_sum_length * N)``. Dr.
      GRPO's unbiased form: each episode's token sum is divided by one
      constant, the maximum generation length, instead of by its own length
      (which favours short correct and long wrong answers), then averaged
      over episodes, as in the Dr. GRPO reference implementation.

    Padding rows (``n_b = 0``) count in none of them; an empty mask gives 0. The sums over ``b`` and
    the counts of tokens and rows are the step's (``totals``): a micro-batch's loss is its share of
    the step's. Without ``totals`` they are those of ``mask`` alone. In a packed batch an episode is
    one of a row's (``membership``, :func:`episode_membership`), not the row.
    """
    mask = mask.astype(jnp.float32)
    total = jnp.sum(per_token * mask)
    tokens_per_episode = _per_episode_sum(mask, membership)
    has_tokens = (tokens_per_episode > 0).astype(jnp.float32)
    totals = totals or step_totals_of_mask(mask, membership)
    num_sequences = totals.sequences
    if mode == "token_mean":
        return total / totals.policy_tokens
    if mode == "seq_mean_token_mean":
        episode_means = _per_episode_sum(per_token * mask, membership) / jnp.maximum(tokens_per_episode, 1.0)
        return jnp.sum(episode_means * has_tokens) / num_sequences
    if mode == "token_sum":
        if token_sum_length is None:
            raise ValueError("token_sum aggregation needs token_sum_length")
        return total / (token_sum_length * num_sequences)
    raise ValueError(f"unknown loss aggregation {mode!r}")


def kl_estimate(
    policy_logprobs: jax.Array,
    reference_logprobs: jax.Array,
    mask: jax.Array,
    estimator: Literal["k1", "k3"],
) -> jax.Array:
    """Per-token estimate of KL(policy || reference) from sampled tokens' log-probs; 0 off the mask.

    k1 = logp - ref_logp (unbiased, can be negative); k3 = exp(ref_logp -
    logp) - (ref_logp - logp) - 1 (unbiased, always >= 0, lower variance; the
    GRPO paper's estimator). Schulman, "Approximating KL divergence", 2020.
    """
    # Off the mask the log-probs are arbitrary; exp() must not overflow there.
    log_ratio = jnp.where(mask > 0, reference_logprobs - policy_logprobs, 0.0)
    if estimator == "k1":
        return -log_ratio
    if estimator == "k3":
        return jnp.exp(log_ratio) - log_ratio - 1.0
    raise ValueError(f"unknown KL estimator {estimator!r}")


def truncated_importance_weights(
    proximal_logprobs: jax.Array,
    behaviour_logprobs: jax.Array,
    mask: jax.Array,
    *,
    level: Literal["token", "sequence"],
    cap: float,
    totals: StepTotals | None = None,
    membership: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Truncated importance weights ``min(pi_proximal / pi_behaviour, cap)`` per token [B, L].

    ``proximal_logprobs`` are the trainer's policy at the start of the step,
    ``behaviour_logprobs`` the producers' (the policy that sampled). Level
    ``token``: one ratio per token. Level ``sequence``: one ratio per episode,
    ``exp(sum over its policy tokens of the log-ratio)``, shared by its
    tokens. Weights are 0 off the mask. Computed in log space so no ratio
    overflows; no gradient flows through them.

    Metrics, over policy tokens (token level) or episodes with policy tokens
    (sequence level), of the untruncated ratio: ``tis_ratio_mean``,
    ``tis_ratio_min``, ``tis_ratio_max`` (log-ratios capped at 80 for
    reporting), ``tis_truncated_fraction`` (ratio > cap) and
    ``tis_weight_mean`` (the truncated weight). ``membership``: a packed batch's episodes
    (:func:`episode_membership`); without it, each row is one.
    """
    mask = mask.astype(jnp.float32)
    log_ratio = jnp.where(mask > 0, proximal_logprobs - behaviour_logprobs, 0.0)
    log_ratio = jax.lax.stop_gradient(log_ratio)
    log_cap = jnp.log(jnp.float32(cap))
    if level == "token":
        units_log_ratio, units = log_ratio, mask
        weights = jnp.exp(jnp.minimum(log_ratio, log_cap)) * mask
    elif level == "sequence":
        units_log_ratio = _per_episode_sum(log_ratio, membership)
        units = (_per_episode_sum(mask, membership) > 0).astype(jnp.float32)
        weights = _per_token(jnp.exp(jnp.minimum(units_log_ratio, log_cap)), membership) * mask
    else:
        raise ValueError(f"unknown importance-sampling level {level!r}")
    totals = totals or step_totals_of_mask(mask, membership)
    units_total = totals.policy_tokens if level == "token" else totals.sequences
    reported = jnp.exp(jnp.minimum(units_log_ratio, _MAX_REPORTED_LOG_RATIO))
    smallest, largest = _masked_min_max(reported, units)
    unit_weights = jnp.exp(jnp.minimum(units_log_ratio, log_cap))
    metrics = {
        "tis_ratio_mean": _step_mean(reported, units, units_total),
        "tis_ratio_min": smallest,
        "tis_ratio_max": largest,
        "tis_truncated_fraction": _step_mean((units_log_ratio > log_cap).astype(jnp.float32), units, units_total),
        "tis_weight_mean": _step_mean(unit_weights, units, units_total),
    }
    return weights, metrics


def step_totals_of_mask(mask: jax.Array, membership: jax.Array | None = None) -> StepTotals:
    """The totals of a policy-token ``mask`` [B, L] taken as a whole step; the episodes are the rows,
    or those of a packed batch's ``membership`` (:func:`episode_membership`)."""
    mask = mask.astype(jnp.float32)
    return StepTotals(policy_tokens=jnp.maximum(jnp.sum(mask), 1.0),
                      sequences=jnp.maximum(jnp.sum(_per_episode_sum(mask, membership) > 0), 1.0))


def clipped_value_loss(
    values: jax.Array, old_values: jax.Array, returns: jax.Array, *, clip: float
) -> jax.Array:
    """PPO2's clipped value loss per token: ``0.5 * max((V - R)^2, (V_clip - R)^2)``.

    ``V_clip = old + clip(V - old, -clip, clip)``: the prediction may move at
    most ``clip`` from the value it had when the data was scored, in the
    direction that would lower the loss.
    """
    clipped = old_values + jnp.clip(values - old_values, -clip, clip)
    return 0.5 * jnp.maximum((values - returns) ** 2, (clipped - returns) ** 2)


def policy_gradient_loss(
    statistics: TokenStatistics,
    batch: TrainBatch,
    *,
    epsilon_low: float,
    epsilon_high: float,
    advantages: jax.Array | None = None,
    aggregation: Aggregation = "token_mean",
    token_sum_length: int | None = None,
    kl_coef: float | None = None,
    kl_estimator: Literal["k1", "k3"] = "k3",
    importance_sampling: Literal["token", "sequence"] | None = None,
    importance_sampling_cap: float = 2.0,
    totals: StepTotals | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The clipped surrogate of PPO/GRPO/DAPO, with optional KL penalty and TIS correction.

    Per policy token::

        objective = w * min(ratio * A, clip(ratio, 1 - epsilon_low, 1 + epsilon_high) * A)
        loss      = -aggregate(objective) + kl_coef * aggregate(kl)

    Without importance sampling, ``ratio = pi_theta / pi_behaviour`` and
    ``w = 1``: the clip keeps the update near the policy that sampled (the
    original GRPO loss). With ``importance_sampling`` ("decoupled PPO",
    as in AReaL and verl's TIS), ``ratio = pi_theta / pi_old`` with ``pi_old``
    the parameters at the start of the step (``stop_gradient`` of the current
    log-probs: with importance sampling a batch gets one update, see
    ``AlgorithmConfig.updates_per_batch``), so the ratio is 1 in value
    and the gradient is ``w * A * grad log pi``; and ``w = min(pi_old /
    pi_behaviour, importance_sampling_cap)`` per token or per sequence.

    Args:
      statistics: the policy's, of the distribution divided by the sampling temperature.
      batch: uses ``loss_mask``, ``behaviour_logprobs``, ``advantages`` (unless
        ``advantages`` is given) and, with a KL penalty, ``extras["reference_logprobs"]``.
      epsilon_low, epsilon_high: asymmetric clip range (DAPO clip-higher).
      advantages: per-token advantages [B, T - 1] at the predicted token's
        slots (PPO); default ``batch.advantages`` [B] broadcast over tokens (a packed batch's
        [B, K], each episode's over its tokens).
      aggregation, token_sum_length, totals: see :func:`aggregate_loss`.
      kl_coef: None disables the KL term (and reading the reference).
      kl_estimator: see :func:`kl_estimate`.
      importance_sampling: None, "token" or "sequence".
      importance_sampling_cap: truncation C of the weights.

    Metrics: ``policy_loss``; ``clip_fraction`` (= ``clip_fraction_low`` +
    ``clip_fraction_high``): share of tokens whose gradient the clip zeroes,
    low: ratio < 1 - epsilon_low with A < 0, high: ratio > 1 + epsilon_high
    with A > 0; ``ratio_mean``; ``entropy`` of the next-token distribution;
    ``advantage_mean``; ``num_tokens``; with KL, ``kl`` (token mean of the
    estimator); with TIS, the metrics of :func:`truncated_importance_weights`.
    """
    mask = _policy_mask(batch)
    membership = episode_membership(batch)
    totals = totals or step_totals_of_mask(mask, membership)
    policy_logprobs = statistics.logprobs
    behaviour_logprobs = batch.behaviour_logprobs[:, 1:].astype(jnp.float32)
    if advantages is None:
        per_episode = batch.advantages.astype(jnp.float32)
        advantages = _per_token(per_episode if membership is not None else per_episode[:, None], membership)
    advantages = jnp.broadcast_to(advantages.astype(jnp.float32), mask.shape)

    metrics: dict[str, jax.Array] = {}
    if importance_sampling is None:
        # Where the mask is 0 the behaviour log-prob is arbitrary (often 0); keep the
        # ratio there at a harmless value so that exp() cannot overflow into inf * 0.
        log_ratio = jnp.where(mask > 0, policy_logprobs - behaviour_logprobs, 0.0)
        weights = jnp.ones_like(mask)
    else:
        old_logprobs = jax.lax.stop_gradient(policy_logprobs)
        log_ratio = jnp.where(mask > 0, policy_logprobs - old_logprobs, 0.0)
        weights, tis_metrics = truncated_importance_weights(
            old_logprobs,
            behaviour_logprobs,
            mask,
            level=importance_sampling,
            cap=importance_sampling_cap,
            totals=totals,
            membership=membership,
        )
        metrics.update(tis_metrics)
    ratio = jnp.exp(log_ratio)
    lower, upper = 1.0 - epsilon_low, 1.0 + epsilon_high
    clipped_ratio = jnp.clip(ratio, lower, upper)
    objective = weights * jnp.minimum(ratio * advantages, clipped_ratio * advantages)
    policy_loss = -aggregate_loss(objective, mask, aggregation, token_sum_length=token_sum_length, totals=totals,
                                  membership=membership)
    loss = policy_loss

    tokens = totals.policy_tokens
    if kl_coef is not None:
        reference_logprobs = batch.extras["reference_logprobs"][:, 1:].astype(jnp.float32)
        kl = kl_estimate(policy_logprobs, reference_logprobs, mask, kl_estimator)
        loss = loss + kl_coef * aggregate_loss(
            kl, mask, aggregation, token_sum_length=token_sum_length, totals=totals, membership=membership
        )
        metrics["kl"] = _step_mean(kl, mask, tokens)

    clipped_low = ((ratio < lower) & (advantages < 0)).astype(jnp.float32)
    clipped_high = ((ratio > upper) & (advantages > 0)).astype(jnp.float32)
    metrics.update(
        {
            "policy_loss": policy_loss,
            "clip_fraction": _step_mean(clipped_low + clipped_high, mask, tokens),
            "clip_fraction_low": _step_mean(clipped_low, mask, tokens),
            "clip_fraction_high": _step_mean(clipped_high, mask, tokens),
            "ratio_mean": _step_mean(ratio, mask, tokens),
            "entropy": _step_mean(statistics.entropy, mask, tokens),
            "advantage_mean": _step_mean(advantages, mask, tokens),
            "num_tokens": jnp.sum(mask),
        }
    )
    return loss, metrics


def grpo_loss(
    statistics: TokenStatistics, batch: TrainBatch, totals: StepTotals | None = None, *, clip_epsilon: float
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """PPO-clipped policy-gradient loss with per-sequence GRPO advantages.

    Per token: ``min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)`` with
    ``ratio = exp(logp - behaviour_logp)``; the loss is minus its token mean.
    There is no KL term: the clipped ratio alone keeps the update near the
    behaviour policy. This is :func:`policy_gradient_loss` with a symmetric
    clip range and ``token_mean`` aggregation; see there for the metrics.
    """
    return policy_gradient_loss(statistics, batch, epsilon_low=clip_epsilon, epsilon_high=clip_epsilon,
                                totals=totals)


@flax.struct.dataclass
class PPOTargets:
    """What PPO's losses compare with, computed once per step over all of its rows, all float32 [B, T - 1]
    at the predicted tokens' slots: the critic's values at the start of the step, and the (whitened)
    GAE advantages and returns from them."""

    old_values: jax.Array
    advantages: jax.Array
    returns: jax.Array


def ppo_targets(
    values: jax.Array, batch: TrainBatch, *, gamma: float, lam: float, normalize_advantages: bool = True
) -> tuple[PPOTargets, dict[str, jax.Array]]:
    """GAE advantages and returns of a whole step from the critic's ``values`` [B, T] at its start.

    ``values[:, t]`` is the critic's value of the state after slot ``t``, i.e. of the decision that
    emits the token at slot ``t + 1``, so it pairs with ``loss_mask[:, t + 1]`` as the token statistics
    do. Rewards come per token in ``batch.extras["token_rewards"]`` [B, T] (the outcome reward at the
    last policy token). Advantages are whitened over the step's policy tokens, so a step in micro-batches
    whitens as the step in one batch.

    Metrics: ``value_mean``, ``return_mean``, ``gae_advantage_mean`` (before whitening) and
    ``explained_variance`` ``1 - Var(R - V) / Var(R)`` over policy tokens (0 if Var(R) = 0).
    """
    mask = _policy_mask(batch)
    old_values = jax.lax.stop_gradient(values[:, :-1].astype(jnp.float32))
    token_rewards = batch.extras["token_rewards"][:, 1:].astype(jnp.float32)
    episodes = None if batch.episodes is None else batch.episodes[:, 1:]
    advantages, returns = gae_advantages(token_rewards, old_values, mask, gamma=gamma, lam=lam, episodes=episodes)
    gae_advantage_mean = _masked_mean(advantages, mask)
    if normalize_advantages:
        centred = advantages - gae_advantage_mean
        advantages = centred / (jnp.sqrt(_masked_variance(advantages, mask)) + 1e-8) * mask
    returns_variance = _masked_variance(returns, mask)
    residual_variance = _masked_variance(returns - old_values, mask)
    metrics = {
        "value_mean": _masked_mean(old_values, mask),
        "return_mean": _masked_mean(returns, mask),
        "gae_advantage_mean": gae_advantage_mean,
        "explained_variance": jnp.where(
            returns_variance > 0, 1.0 - residual_variance / jnp.maximum(returns_variance, 1e-12), 0.0),
    }
    return PPOTargets(old_values=old_values, advantages=advantages, returns=returns), metrics


def ppo_loss(
    statistics: TokenStatistics,
    values: jax.Array,
    batch: TrainBatch,
    targets: PPOTargets,
    *,
    value_coef: float,
    value_clip: float,
    totals: StepTotals | None = None,
    **policy_loss_options,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """PPO with a critic: token-level GAE advantages, clipped policy loss, clipped value loss.

    ``targets`` (:func:`ppo_targets`) hold the step's advantages and returns, from the values at its
    start; ``values`` [B, T] are the critic's now, which the value loss trains and clips around
    ``targets.old_values`` (with one update per batch they are equal in value, so the clip only
    binds in later updates; :func:`clipped_value_loss`).

    ``loss = policy loss (+ KL) + value_coef * aggregate(clipped value loss)``,
    both aggregated the same way. ``policy_loss_options`` are those of
    :func:`policy_gradient_loss` (clip range, aggregation, KL, TIS).

    Metrics: those of :func:`policy_gradient_loss` (its ``advantage_mean`` is
    after whitening) plus ``value_loss``.
    """
    mask = _policy_mask(batch)
    membership = episode_membership(batch)
    totals = totals or step_totals_of_mask(mask, membership)
    loss, metrics = policy_gradient_loss(
        statistics, batch, advantages=targets.advantages, totals=totals, **policy_loss_options
    )
    value_loss = aggregate_loss(
        clipped_value_loss(values[:, :-1].astype(jnp.float32), targets.old_values, targets.returns,
                           clip=value_clip),
        mask,
        policy_loss_options.get("aggregation", "token_mean"),
        token_sum_length=policy_loss_options.get("token_sum_length"),
        totals=totals,
        membership=membership,
    )
    metrics["value_loss"] = value_loss
    return loss + value_coef * value_loss, metrics


def sft_loss(
    statistics: TokenStatistics, batch: TrainBatch, totals: StepTotals | None = None
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Masked next-token negative log-likelihood, token mean over ``loss_mask``.

    Metrics: ``token_accuracy`` (argmax equals target, over masked-in tokens)
    and ``num_tokens``.
    """
    mask = _policy_mask(batch)
    totals = totals or step_totals_of_mask(mask)
    metrics = {
        "token_accuracy": _step_mean(statistics.argmax_hits, mask, totals.policy_tokens),
        "num_tokens": jnp.sum(mask),
    }
    return _step_mean(-statistics.logprobs, mask, totals.policy_tokens), metrics
