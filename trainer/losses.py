"""Losses of the SFT and RL phases, as pure jnp functions.

Every loss shares one shift convention: the logits at slot ``t`` predict the
token at slot ``t + 1``, so a loss pairs ``logits[:, :-1]`` with
``tokens[:, 1:]``, and the per-token inputs (``loss_mask``,
``behaviour_logprobs``, and the per-token extras such as
``extras["reference_logprobs"]`` or ``extras["token_rewards"]``) are read at
the predicted token's slot, ``[:, 1:]``. A loss mask of 1 marks tokens the
policy generated; prompt, environment and tool tokens (and padding) have 0
and contribute neither loss nor gradient.

How per-token losses become one number is the aggregation mode
(:func:`aggregate_loss`): ``token_mean`` (the default, so a long episode
weighs in proportion to its tokens), ``seq_mean_token_mean`` or
``token_sum``. Padding rows weigh nothing in any of them.

Every loss returns ``(scalar loss, dict of scalar metrics)``; the metrics
are averaged over policy tokens unless their name says otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

import jax
import jax.numpy as jnp

from trainer.advantages import gae_advantages, grpo_advantages

if TYPE_CHECKING:
    from trainer.train_step import TrainBatch

__all__ = [
    "LossFn",
    "aggregate_loss",
    "clipped_value_loss",
    "grpo_advantages",
    "grpo_loss",
    "kl_estimate",
    "policy_gradient_loss",
    "ppo_loss",
    "sft_loss",
    "token_logprobs",
    "truncated_importance_weights",
]

# A loss maps the policy's logits [B, T, V] and the batch they came from to
# (scalar loss, scalar metrics). The train step differentiates the loss only.
LossFn = Callable[[jax.Array, "TrainBatch"], tuple[jax.Array, dict[str, jax.Array]]]

Aggregation = Literal["token_mean", "seq_mean_token_mean", "token_sum"]

# Sequence-level importance ratios are products over hundreds of tokens; their
# statistics are reported from log-ratios capped here so that they stay finite.
_MAX_REPORTED_LOG_RATIO = 80.0


def token_logprobs(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """log p(targets[b, t]) under softmax(logits[b, t]); [B, T, V], [B, T] -> [B, T]."""
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(log_probs, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]


def _shifted(logits: jax.Array, batch: TrainBatch) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(logits of the predicting slots, predicted tokens, their loss mask)."""
    return logits[:, :-1], batch.tokens[:, 1:], batch.loss_mask[:, 1:].astype(jnp.float32)


def _masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def _masked_variance(values: jax.Array, mask: jax.Array) -> jax.Array:
    return _masked_mean((values - _masked_mean(values, mask)) ** 2, mask)


def _masked_min_max(values: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Min and max over ``mask``; both 0 when the mask is empty."""
    selected = mask > 0
    any_selected = jnp.any(selected)
    smallest = jnp.min(jnp.where(selected, values, jnp.inf))
    largest = jnp.max(jnp.where(selected, values, -jnp.inf))
    return jnp.where(any_selected, smallest, 0.0), jnp.where(any_selected, largest, 0.0)


def aggregate_loss(
    per_token: jax.Array,
    mask: jax.Array,
    mode: Aggregation,
    *,
    token_sum_length: int | None = None,
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

    Padding rows (``n_b = 0``) count in none of them; an empty mask gives 0.
    """
    mask = mask.astype(jnp.float32)
    total = jnp.sum(per_token * mask)
    tokens_per_row = jnp.sum(mask, axis=-1)
    has_tokens = (tokens_per_row > 0).astype(jnp.float32)
    num_sequences = jnp.maximum(jnp.sum(has_tokens), 1.0)
    if mode == "token_mean":
        return total / jnp.maximum(jnp.sum(mask), 1.0)
    if mode == "seq_mean_token_mean":
        row_means = jnp.sum(per_token * mask, axis=-1) / jnp.maximum(tokens_per_row, 1.0)
        return jnp.sum(row_means * has_tokens) / num_sequences
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
    ``tis_weight_mean`` (the truncated weight).
    """
    mask = mask.astype(jnp.float32)
    log_ratio = jnp.where(mask > 0, proximal_logprobs - behaviour_logprobs, 0.0)
    log_ratio = jax.lax.stop_gradient(log_ratio)
    log_cap = jnp.log(jnp.float32(cap))
    if level == "token":
        units_log_ratio, units = log_ratio, mask
        weights = jnp.exp(jnp.minimum(log_ratio, log_cap)) * mask
    elif level == "sequence":
        units_log_ratio = jnp.sum(log_ratio, axis=-1)
        units = (jnp.sum(mask, axis=-1) > 0).astype(jnp.float32)
        weights = jnp.exp(jnp.minimum(units_log_ratio, log_cap))[:, None] * mask
    else:
        raise ValueError(f"unknown importance-sampling level {level!r}")
    reported = jnp.exp(jnp.minimum(units_log_ratio, _MAX_REPORTED_LOG_RATIO))
    smallest, largest = _masked_min_max(reported, units)
    unit_weights = jnp.exp(jnp.minimum(units_log_ratio, log_cap))
    metrics = {
        "tis_ratio_mean": _masked_mean(reported, units),
        "tis_ratio_min": smallest,
        "tis_ratio_max": largest,
        "tis_truncated_fraction": _masked_mean(
            (units_log_ratio > log_cap).astype(jnp.float32), units
        ),
        "tis_weight_mean": _masked_mean(unit_weights, units),
    }
    return weights, metrics


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
    logits: jax.Array,
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
      logits: [B, T, V], already divided by the sampling temperature.
      batch: uses ``tokens``, ``loss_mask``, ``behaviour_logprobs``,
        ``advantages`` (unless ``advantages`` is given) and, with a KL
        penalty, ``extras["reference_logprobs"]``.
      epsilon_low, epsilon_high: asymmetric clip range (DAPO clip-higher).
      advantages: per-token advantages [B, T - 1] at the predicted token's
        slots (PPO); default ``batch.advantages`` [B] broadcast over tokens.
      aggregation, token_sum_length: see :func:`aggregate_loss`.
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
    logits, targets, mask = _shifted(logits, batch)
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    policy_logprobs = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    behaviour_logprobs = batch.behaviour_logprobs[:, 1:].astype(jnp.float32)
    if advantages is None:
        advantages = batch.advantages.astype(jnp.float32)[:, None]
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
        )
        metrics.update(tis_metrics)
    ratio = jnp.exp(log_ratio)
    lower, upper = 1.0 - epsilon_low, 1.0 + epsilon_high
    clipped_ratio = jnp.clip(ratio, lower, upper)
    objective = weights * jnp.minimum(ratio * advantages, clipped_ratio * advantages)
    policy_loss = -aggregate_loss(objective, mask, aggregation, token_sum_length=token_sum_length)
    loss = policy_loss

    if kl_coef is not None:
        reference_logprobs = batch.extras["reference_logprobs"][:, 1:].astype(jnp.float32)
        kl = kl_estimate(policy_logprobs, reference_logprobs, mask, kl_estimator)
        loss = loss + kl_coef * aggregate_loss(
            kl, mask, aggregation, token_sum_length=token_sum_length
        )
        metrics["kl"] = _masked_mean(kl, mask)

    clipped_low = ((ratio < lower) & (advantages < 0)).astype(jnp.float32)
    clipped_high = ((ratio > upper) & (advantages > 0)).astype(jnp.float32)
    entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
    metrics.update(
        {
            "policy_loss": policy_loss,
            "clip_fraction": _masked_mean(clipped_low + clipped_high, mask),
            "clip_fraction_low": _masked_mean(clipped_low, mask),
            "clip_fraction_high": _masked_mean(clipped_high, mask),
            "ratio_mean": _masked_mean(ratio, mask),
            "entropy": _masked_mean(entropy, mask),
            "advantage_mean": _masked_mean(advantages, mask),
            "num_tokens": jnp.sum(mask),
        }
    )
    return loss, metrics


def grpo_loss(
    logits: jax.Array, batch: TrainBatch, *, clip_epsilon: float
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """PPO-clipped policy-gradient loss with per-sequence GRPO advantages.

    Per token: ``min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)`` with
    ``ratio = exp(logp - behaviour_logp)``; the loss is minus its token mean.
    There is no KL term: the clipped ratio alone keeps the update near the
    behaviour policy. This is :func:`policy_gradient_loss` with a symmetric
    clip range and ``token_mean`` aggregation; see there for the metrics.
    """
    return policy_gradient_loss(logits, batch, epsilon_low=clip_epsilon, epsilon_high=clip_epsilon)


def ppo_loss(
    logits: jax.Array,
    values: jax.Array,
    batch: TrainBatch,
    *,
    gamma: float,
    lam: float,
    value_coef: float,
    value_clip: float,
    normalize_advantages: bool = True,
    **policy_loss_options,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """PPO with a critic: token-level GAE advantages, clipped policy loss, clipped value loss.

    ``values[:, t]`` is the critic's value of the state after slot ``t``, i.e.
    of the decision that emits the token at slot ``t + 1``, so it pairs with
    ``loss_mask[:, t + 1]`` like the logits do. Rewards come per token in
    ``batch.extras["token_rewards"]`` [B, T] (the outcome reward at the last
    policy token). GAE (:func:`trainer.advantages.gae_advantages`) uses the
    values at the start of the step, ``stop_gradient(values)``; with one
    update per batch these are also the "old" values the value loss clips
    around, so the clip only binds when the values it is given as old differ
    (it is kept so that the loss is PPO's; :func:`clipped_value_loss`).

    ``loss = policy loss (+ KL) + value_coef * aggregate(clipped value loss)``,
    both aggregated the same way. ``policy_loss_options`` are those of
    :func:`policy_gradient_loss` (clip range, aggregation, KL, TIS).

    Metrics: those of :func:`policy_gradient_loss` (its ``advantage_mean`` is
    after whitening) plus ``value_loss``, ``value_mean``, ``return_mean``,
    ``gae_advantage_mean`` (before whitening) and ``explained_variance``
    ``1 - Var(R - V) / Var(R)`` over policy tokens (0 if Var(R) = 0).
    """
    mask = batch.loss_mask[:, 1:].astype(jnp.float32)
    state_values = values[:, :-1].astype(jnp.float32)
    old_values = jax.lax.stop_gradient(state_values)
    token_rewards = batch.extras["token_rewards"][:, 1:].astype(jnp.float32)
    advantages, returns = gae_advantages(token_rewards, old_values, mask, gamma=gamma, lam=lam)
    gae_advantage_mean = _masked_mean(advantages, mask)
    if normalize_advantages:
        centred = advantages - gae_advantage_mean
        advantages = centred / (jnp.sqrt(_masked_variance(advantages, mask)) + 1e-8) * mask

    loss, metrics = policy_gradient_loss(
        logits, batch, advantages=advantages, **policy_loss_options
    )
    aggregation = policy_loss_options.get("aggregation", "token_mean")
    token_sum_length = policy_loss_options.get("token_sum_length")
    value_loss = aggregate_loss(
        clipped_value_loss(state_values, old_values, returns, clip=value_clip),
        mask,
        aggregation,
        token_sum_length=token_sum_length,
    )
    returns_variance = _masked_variance(returns, mask)
    residual_variance = _masked_variance(returns - old_values, mask)
    metrics.update(
        {
            "value_loss": value_loss,
            "value_mean": _masked_mean(old_values, mask),
            "return_mean": _masked_mean(returns, mask),
            "gae_advantage_mean": gae_advantage_mean,
            "explained_variance": jnp.where(
                returns_variance > 0,
                1.0 - residual_variance / jnp.maximum(returns_variance, 1e-12),
                0.0,
            ),
        }
    )
    return loss + value_coef * value_loss, metrics


def sft_loss(logits: jax.Array, batch: TrainBatch) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Masked next-token negative log-likelihood, token mean over ``loss_mask``.

    Metrics: ``token_accuracy`` (argmax equals target, over masked-in tokens)
    and ``num_tokens``.
    """
    logits, targets, mask = _shifted(logits, batch)
    nll = -token_logprobs(logits, targets)
    correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
    metrics = {
        "token_accuracy": _masked_mean(correct, mask),
        "num_tokens": jnp.sum(mask),
    }
    return _masked_mean(nll, mask), metrics
