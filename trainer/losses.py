"""Losses of the SFT and RL phases, as pure jnp functions.

Every loss shares one shift convention: the logits at slot ``t`` predict the
token at slot ``t + 1``, so a loss pairs ``logits[:, :-1]`` with
``tokens[:, 1:]``, and the per-token inputs (``loss_mask``,
``behaviour_logprobs``) are read at the predicted token's slot, ``[:, 1:]``.
A loss mask of 1 marks tokens the policy generated; prompt, environment and
tool tokens (and padding) have 0 and contribute neither loss nor gradient.

Losses are token means over the masked-in tokens of the whole batch, so a
long episode weighs in proportion to its tokens and padding rows weigh
nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

if TYPE_CHECKING:
    from trainer.train_step import TrainBatch

# A loss maps the policy's logits [B, T, V] and the batch they came from to
# (scalar loss, scalar metrics). The train step differentiates the loss only.
LossFn = Callable[[jax.Array, "TrainBatch"], tuple[jax.Array, dict[str, jax.Array]]]


def token_logprobs(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """log p(targets[b, t]) under softmax(logits[b, t]); [B, T, V], [B, T] -> [B, T]."""
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return jnp.take_along_axis(log_probs, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]


def grpo_advantages(
    rewards: jax.Array,
    group_ids: jax.Array,
    valid: jax.Array,
    num_groups: int,
    eps: float = 1e-6,
) -> jax.Array:
    """Group-relative advantages of GRPO (Shao et al., 2024): (r - mean) / (std + eps).

    Mean and std are over the valid members of each group; the std is the
    population std (divide by the member count, not count - 1), so a group of
    identical rewards gets advantage 0 for everyone and a group of one valid
    member is well defined (also 0). Invalid rows (e.g. padding or episodes
    dropped as stale) get 0 and do not shift their group's statistics.

    Args:
      rewards: float [N].
      group_ids: int32 [N], dense in ``0 .. num_groups - 1``.
      valid: bool [N].
      num_groups: static number of groups.
      eps: keeps low-variance groups from blowing up.
    Returns:
      float32 [N] advantages.
    """
    rewards = rewards.astype(jnp.float32)
    weights = valid.astype(jnp.float32)
    counts = jax.ops.segment_sum(weights, group_ids, num_segments=num_groups)
    counts = jnp.maximum(counts, 1.0)
    means = jax.ops.segment_sum(rewards * weights, group_ids, num_segments=num_groups) / counts
    deviations = rewards - means[group_ids]
    variances = (
        jax.ops.segment_sum(weights * deviations**2, group_ids, num_segments=num_groups) / counts
    )
    advantages = deviations / (jnp.sqrt(variances)[group_ids] + eps)
    return jnp.where(valid, advantages, 0.0)


def _shifted(logits: jax.Array, batch: TrainBatch) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(logits of the predicting slots, predicted tokens, their loss mask)."""
    return logits[:, :-1], batch.tokens[:, 1:], batch.loss_mask[:, 1:].astype(jnp.float32)


def _masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
    return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def grpo_loss(
    logits: jax.Array, batch: TrainBatch, *, clip_epsilon: float
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """PPO-clipped policy-gradient loss with per-sequence GRPO advantages.

    Per token: ``min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)`` with
    ``ratio = exp(logp - behaviour_logp)``; the loss is minus its token mean.
    There is no KL term: the clipped ratio alone keeps the update near the
    behaviour policy.

    Metrics (token means over masked-in tokens):
      clip_fraction: share of tokens whose gradient the clip zeroes, i.e.
        ratio > 1 + eps with A > 0, or ratio < 1 - eps with A < 0.
      ratio_mean: mean importance ratio; drifts from 1 as the data goes stale.
      entropy: entropy of the policy's (untempered) next-token distribution.
      num_tokens: masked-in tokens in the batch.
    """
    logits, targets, mask = _shifted(logits, batch)
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    policy_logprobs = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    behaviour_logprobs = batch.behaviour_logprobs[:, 1:].astype(jnp.float32)
    advantages = batch.advantages.astype(jnp.float32)[:, None]

    # Where the mask is 0 the behaviour log-prob is arbitrary (often 0); keep the
    # ratio there at a harmless value so that exp() cannot overflow into inf * 0.
    log_ratio = jnp.where(mask > 0, policy_logprobs - behaviour_logprobs, 0.0)
    ratio = jnp.exp(log_ratio)
    clipped_ratio = jnp.clip(ratio, 1.0 - clip_epsilon, 1.0 + clip_epsilon)
    objective = jnp.minimum(ratio * advantages, clipped_ratio * advantages)
    loss = -_masked_mean(objective, mask)

    clipped = ((ratio > 1.0 + clip_epsilon) & (advantages > 0)) | (
        (ratio < 1.0 - clip_epsilon) & (advantages < 0)
    )
    entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
    metrics = {
        "clip_fraction": _masked_mean(clipped.astype(jnp.float32), mask),
        "ratio_mean": _masked_mean(ratio, mask),
        "entropy": _masked_mean(entropy, mask),
        "num_tokens": jnp.sum(mask),
    }
    return loss, metrics


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
