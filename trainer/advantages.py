"""From episode rewards to advantages: reward shaping, group filtering and the estimators.

Group estimators (GRPO, Dr. GRPO, RLOO) give one advantage per episode,
relative to the other episodes of its group (episodes of one task). They
are jnp functions of flat arrays with dense group ids, usable on host or
under jit. GAE gives one advantage per policy token from per-token rewards
and a critic's values; it runs inside PPO's loss.

The shaping and filtering helpers are plain numpy: they run on host, before
a batch exists.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def _group_means(
    rewards: jax.Array, group_ids: jax.Array, weights: jax.Array, num_groups: int
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(per-group sum of valid rewards, valid counts, means); counts floored at 1 for the mean."""
    sums = jax.ops.segment_sum(rewards * weights, group_ids, num_segments=num_groups)
    counts = jax.ops.segment_sum(weights, group_ids, num_segments=num_groups)
    return sums, counts, sums / jnp.maximum(counts, 1.0)


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
    _, counts, means = _group_means(rewards, group_ids, weights, num_groups)
    deviations = rewards - means[group_ids]
    variances = jax.ops.segment_sum(
        weights * deviations**2, group_ids, num_segments=num_groups
    ) / jnp.maximum(counts, 1.0)
    advantages = deviations / (jnp.sqrt(variances)[group_ids] + eps)
    return jnp.where(valid, advantages, 0.0)


def dr_grpo_advantages(
    rewards: jax.Array, group_ids: jax.Array, valid: jax.Array, num_groups: int
) -> jax.Array:
    """Dr. GRPO advantages (Liu et al., 2025): ``r - mean`` over the group's valid members.

    Dividing by the group std, as GRPO does, up-weights groups that are
    nearly all right or all wrong (a difficulty bias); Dr. GRPO drops it.
    Invalid rows get 0 and do not count in the mean.
    """
    rewards = rewards.astype(jnp.float32)
    _, _, means = _group_means(rewards, group_ids, valid.astype(jnp.float32), num_groups)
    return jnp.where(valid, rewards - means[group_ids], 0.0)


def rloo_advantages(
    rewards: jax.Array, group_ids: jax.Array, valid: jax.Array, num_groups: int
) -> jax.Array:
    """REINFORCE leave-one-out (Ahmadian et al., 2024): ``r_i - mean of the other valid members``.

    With ``n`` valid members summing to ``S``, that is ``r_i - (S - r_i) /
    (n - 1)``. The baseline excludes the episode itself, so it is unbiased.
    A group with fewer than two valid members has no baseline: advantage 0.
    """
    rewards = rewards.astype(jnp.float32)
    sums, counts, _ = _group_means(rewards, group_ids, valid.astype(jnp.float32), num_groups)
    others = counts[group_ids] - 1.0
    baseline = (sums[group_ids] - rewards) / jnp.maximum(others, 1.0)
    return jnp.where(valid & (others >= 1.0), rewards - baseline, 0.0)


def gae_advantages(
    rewards: jax.Array,
    values: jax.Array,
    mask: jax.Array,
    *,
    gamma: float,
    lam: float,
    episodes: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimation over the policy's tokens only (Schulman et al., 2016).

    The steps of the MDP are the tokens where ``mask`` is 1; tokens between
    them (prompt, tool output, environment turns) are not actions, so the
    recursion skips them: the successor of the last token of one policy turn
    is the first token of the next. After the last policy token the episode
    ends (next value 0). Per policy token ``t`` with successor ``t'``::

        delta_t = r_t + gamma * V_t' - V_t
        A_t     = delta_t + gamma * lam * A_t'

    Rewards where ``mask`` is 0 are ignored (place an outcome reward on the
    last policy token).

    Args:
      rewards, values: float [B, L], both already at the action's slot.
      mask: [B, L], 1 on policy tokens.
      gamma, lam: discount and GAE lambda.
      episodes: int [B, L], a packed row's episode of each slot (``TrainBatch.episodes``): an
        episode's last policy token has no successor, whatever follows it in the row. None: each
        row is one episode.
    Returns:
      (advantages [B, L], returns = advantages + values [B, L]), 0 off the mask.
    """
    rewards = rewards.astype(jnp.float32)
    values = values.astype(jnp.float32)
    on = mask > 0
    if episodes is None:
        episodes = jnp.ones(rewards.shape, jnp.int32)

    def step(carry, inputs):
        next_value, next_advantage, next_episode = carry
        reward, value, is_action, episode = inputs
        # The successor is in another episode (or there is none yet): this is its episode's last action.
        same_episode = next_episode == episode
        next_value = jnp.where(same_episode, next_value, 0.0)
        next_advantage = jnp.where(same_episode, next_advantage, 0.0)
        advantage = reward + gamma * next_value - value + gamma * lam * next_advantage
        carry = (
            jnp.where(is_action, value, next_value),
            jnp.where(is_action, advantage, next_advantage),
            jnp.where(is_action, episode, next_episode),
        )
        return carry, jnp.where(is_action, advantage, 0.0)

    zeros = jnp.zeros(rewards.shape[0], jnp.float32)
    none_yet = jnp.zeros(rewards.shape[0], jnp.int32)
    _, advantages = jax.lax.scan(step, (zeros, zeros, none_yet), (rewards.T, values.T, on.T, episodes.T),
                                 reverse=True)
    advantages = advantages.T
    returns = jnp.where(on, advantages + values, 0.0)
    return advantages, returns


def overlong_penalty(
    lengths: np.ndarray, *, max_length: int, cache_length: int, penalty_factor: float = 1.0
) -> np.ndarray:
    """DAPO's soft overlong punishment (Yu et al., 2025, eq. 13), to add to the reward.

    ``lengths`` are generated lengths in policy tokens. Zero up to ``max_length
    - cache_length``, then falling linearly to ``-penalty_factor`` at
    ``max_length``, and ``-penalty_factor`` beyond.
    """
    lengths = np.asarray(lengths, np.float64)
    soft_limit = max_length - cache_length
    penalty = np.clip((soft_limit - lengths) / cache_length, -1.0, 0.0)
    return (penalty_factor * penalty).astype(np.float32)


def groups_with_reward_variance(
    rewards: np.ndarray, group_ids: np.ndarray, valid: np.ndarray, num_groups: int
) -> np.ndarray:
    """bool [num_groups]: which groups DAPO's dynamic sampling keeps.

    A group is kept when its valid members' rewards are not all equal (so at
    least two valid members). A group of all-correct or all-wrong answers has
    zero group-relative advantage everywhere and would only dilute the batch.
    """
    rewards = np.asarray(rewards, np.float64)
    keep = np.zeros(num_groups, np.bool_)
    for group in range(num_groups):
        members = rewards[(group_ids == group) & valid]
        keep[group] = members.size >= 2 and bool(np.ptp(members) > 0)
    return keep
