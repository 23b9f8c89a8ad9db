"""Post-training algorithms, built from a run's :class:`~tandem.configs.algorithm.AlgorithmConfig`.

An :class:`Algorithm` is the three things the run loop needs to know about
SFT, GRPO, Dr. GRPO, DAPO, RLOO or PPO:

1. :meth:`Algorithm.prepare` (host): from complete groups of trajectory
   records to the episodes to train on, with their (shaped) rewards and
   per-episode advantages, and host statistics. In order: failed episodes
   are set aside (they stay out of group statistics and of the batch);
   dynamic sampling drops groups without reward variance; overlong shaping
   adds its penalty to the rewards; the group estimator turns rewards into
   advantages.
2. :meth:`Algorithm.batch` (host, then device): pads the prepared episodes
   into a :class:`~trainer.train_batch.TrainBatch` whose ``extras`` hold every
   key in :attr:`Algorithm.extras_keys` (per-token rewards for PPO, reference
   log-probs for a KL penalty, computed here with the reference policy
   outside the train step).
3. :attr:`Algorithm.loss_fn`: a ``(model, batch)`` loss for
   :func:`~trainer.train_step.make_train_step`.

Plus two flags: :attr:`Algorithm.needs_reference` (keep a frozen copy of the
policy and pass it to :meth:`Algorithm.batch`) and
:attr:`Algorithm.needs_value_head` (train a
:class:`~trainer.value_head.PolicyWithValue` and publish only its
:func:`~trainer.value_head.policy_params`).

Example (the RL phase of the run loop)::

    algorithm = build_algorithm(config.algorithm, temperature=config.sampling.temperature,
                                max_policy_tokens=config.sampling.max_new_tokens * config.rollout.max_turns)
    model = Transformer(model_config, rngs=nnx.Rngs(seed))
    if algorithm.needs_value_head:
        model = with_value_head(model, d_model=model_config.d_model, rngs=nnx.Rngs(seed + 1))
    graphdef, state = create_train_state(model, optimizer)
    rl_step = make_train_step(graphdef, optimizer, algorithm.loss_fn)
    reference = None
    if algorithm.needs_reference:  # after SFT; copied, as the train step donates its state
        reference = ReferencePolicy(graphdef, jax.tree.map(jnp.copy, state.params))
    ...
    prepared = algorithm.prepare([[entry.record for entry in group] for group in groups])
    if prepared.records:                                # dynamic sampling may drop everything
        batch = algorithm.batch(prepared, batch_size=..., length_buckets=..., pad_id=...,
                                reference=reference)
        state, metrics = rl_step(state, batch)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tandem.configs.algorithm import AlgorithmConfig
from tandem.configs.memory import micro_batch_rows
from tandem.contracts import TrajectoryRecord
from trainer.advantages import (
    dr_grpo_advantages,
    groups_with_reward_variance,
    grpo_advantages,
    overlong_penalty,
    rloo_advantages,
)
from trainer.losses import PPOTargets, policy_gradient_loss, ppo_loss, ppo_targets, sft_loss
from trainer.token_statistics import policy_token_statistics
from trainer.train_batch import TrainBatch, pack_batch, pad_batch
from trainer.train_step import (
    DEFAULT_LOGITS_CHUNK_TOKENS,
    StepLoss,
    per_row_in_micro_batches,
)

REFERENCE_LOGPROBS = "reference_logprobs"
TOKEN_REWARDS = "token_rewards"
# PPO's targets of the whole step (losses.PPOTargets), in the batch's extras for its micro-batches.
_PPO_TARGET_EXTRAS = {"old_values": "ppo_old_values", "advantages": "ppo_advantages", "returns": "ppo_returns"}

# DAPO's soft band: L_cache = 4096 of L_max = 20480.
_DEFAULT_CACHE_FRACTION = 0.2

# (rewards [N], group_ids [N], valid [N], num_groups) -> advantages [N]
GroupEstimator = Callable[[jax.Array, jax.Array, jax.Array, int], jax.Array]


def _group_estimators(config: AlgorithmConfig) -> dict[str, GroupEstimator]:
    """The registry of per-episode advantage estimators, by ``advantage_estimator``."""
    return {
        "grpo": functools.partial(grpo_advantages, eps=config.advantage_eps),
        "dr_grpo": dr_grpo_advantages,
        "rloo": rloo_advantages,
    }


@dataclass(frozen=True)
class ReferencePolicy:
    """The frozen policy a KL penalty pulls towards (usually the policy after SFT)."""

    # Graphdef of the model ``params`` belong to (a bare policy or a PolicyWithValue).
    graphdef: nnx.GraphDef
    # Its parameters; never updated.
    params: nnx.State

    def logprobs(self, batch: TrainBatch, *, temperature: float,
                 logits_chunk_tokens: int = DEFAULT_LOGITS_CHUNK_TOKENS,
                 micro_batch_tokens: int | None = None) -> jax.Array:
        """:func:`reference_logprobs` of ``batch`` (the leader of a multi-process trainer overrides it to
        announce the call, which is a collective: trainer/lockstep.py)."""
        return reference_logprobs(self.graphdef, self.params, batch, temperature=temperature,
                                  logits_chunk_tokens=logits_chunk_tokens, micro_batch_tokens=micro_batch_tokens)


@dataclass(frozen=True)
class PreparedEpisodes:
    """What :meth:`Algorithm.prepare` keeps of a step's groups; aligned lists of episodes."""

    # The episodes to train on, group by group, in input order.
    records: tuple[TrajectoryRecord, ...]
    # float32 [N]: reward after shaping (overlong penalty added).
    rewards: np.ndarray
    # float32 [N]: per-episode advantage; zeros for sft and ppo (whose advantages are per token).
    advantages: np.ndarray
    # Host statistics, all floats: groups, groups_dropped, episodes, episodes_failed,
    # reward_mean (raw, over successful episodes), shaped_reward_mean (kept episodes),
    # overlong_penalty_mean and overlong_penalized_fraction (successful episodes),
    # policy_tokens_mean (successful episodes).
    stats: dict[str, float]


@functools.partial(jax.jit, static_argnums=(0,),
                   static_argnames=("temperature", "logits_chunk_tokens", "micro_batch_tokens"))
def reference_logprobs(
    graphdef: nnx.GraphDef, ref_params: nnx.State, batch: TrainBatch, *, temperature: float = 1.0,
    logits_chunk_tokens: int = DEFAULT_LOGITS_CHUNK_TOKENS, micro_batch_tokens: int | None = None,
) -> jax.Array:
    """Log-probs of the batch's tokens under the reference policy, float32 [B, T].

    Same convention as ``behaviour_logprobs``: slot ``t`` holds the log-prob
    of the token at slot ``t`` (so slot 0 is 0), of the temperature-scaled
    distribution, and 0 where the loss mask is 0. Pure and jitted once per
    batch shape; call it outside the train step, no gradient is needed. The
    logits exist ``logits_chunk_tokens`` at a time (trainer/token_statistics.py), and the forward pass
    runs in the train step's micro-batches of ``micro_batch_tokens``, so that its activations stay
    those of one micro-batch however many episodes the step has.
    """
    model = nnx.merge(graphdef, ref_params)

    def logprobs_of(part: TrainBatch) -> jax.Array:
        statistics, _ = policy_token_statistics(model, part, temperature=temperature,
                                                chunk_tokens=logits_chunk_tokens)
        logprobs = jnp.where(part.loss_mask[:, 1:] > 0, statistics.logprobs, 0.0)
        return jnp.pad(logprobs, ((0, 0), (1, 0)))

    rows, length = batch.tokens.shape
    return per_row_in_micro_batches(logprobs_of, batch, micro_batch_rows(rows, length, micro_batch_tokens))


class Algorithm:
    """One configured post-training algorithm; build it with :func:`build_algorithm`."""

    def __init__(
        self, config: AlgorithmConfig, *, temperature: float, max_policy_tokens: int | None,
        logits_chunk_tokens: int = DEFAULT_LOGITS_CHUNK_TOKENS, remat: str = "none",
        micro_batch_tokens: int | None = None, attention_query_chunk: int | None = None,
    ):
        self.config = config
        self.temperature = temperature
        self.logits_chunk_tokens = logits_chunk_tokens
        self.micro_batch_tokens = micro_batch_tokens
        self.remat = remat
        self.attention_query_chunk = attention_query_chunk
        estimator = config.advantage_estimator
        # Keep a frozen reference and fill extras["reference_logprobs"] (KL penalty).
        self.needs_reference: bool = config.kl is not None
        # Train a PolicyWithValue; extras["token_rewards"] carries the rewards.
        self.needs_value_head: bool = estimator == "gae"
        # The batch.extras keys loss_fn reads; batch() fills all of them.
        self.extras_keys: tuple[str, ...] = (
            *((REFERENCE_LOGPROBS,) if self.needs_reference else ()),
            *((TOKEN_REWARDS,) if self.needs_value_head else ()),
        )
        estimator_fn = _group_estimators(config).get(estimator)
        # Jitted: run op by op, the estimator's few segment sums cost milliseconds
        # of dispatch per step; compiled, one call (per number of groups).
        self._group_estimator = (
            None if estimator_fn is None else jax.jit(estimator_fn, static_argnums=(3,))
        )

        self._overlong: tuple[int, int] | None = None
        if config.overlong is not None:
            max_length = config.overlong.max_length or max_policy_tokens
            if max_length is None:
                raise ValueError("overlong shaping needs overlong.max_length or max_policy_tokens")
            cache_length = config.overlong.cache_length or max(
                1, round(_DEFAULT_CACHE_FRACTION * max_length)
            )
            self._overlong = (max_length, min(cache_length, max_length))
        token_sum_length = None
        if config.loss_aggregation == "token_sum":
            token_sum_length = config.token_sum_length or max_policy_tokens
            if token_sum_length is None:
                raise ValueError(
                    "token_sum aggregation needs token_sum_length or max_policy_tokens"
                )
        self.loss_fn: StepLoss = self._make_loss_fn(token_sum_length)
        # The SFT phase's (and an SFT-only run's): next-token likelihood, whatever the RL algorithm.
        self.sft_loss_fn: StepLoss = StepLoss(self._supervised)

    def _statistics(self, model, batch: TrainBatch, *, temperature: float):
        return policy_token_statistics(model, batch, temperature=temperature, chunk_tokens=self.logits_chunk_tokens,
                                       remat=self.remat, query_chunk=self.attention_query_chunk)

    def _supervised(self, model, batch: TrainBatch, totals):
        statistics, _ = self._statistics(model, batch, temperature=1.0)
        return sft_loss(statistics, batch, totals)

    def _make_loss_fn(self, token_sum_length: int | None) -> StepLoss:
        config, temperature = self.config, self.temperature
        if config.advantage_estimator == "none":
            return StepLoss(self._supervised)

        options = {
            "epsilon_low": config.epsilon_low,
            "epsilon_high": config.epsilon_high,
            "aggregation": config.loss_aggregation,
            "token_sum_length": token_sum_length,
            "kl_coef": None if config.kl is None else config.kl.coef,
            "kl_estimator": "k3" if config.kl is None else config.kl.estimator,
            "importance_sampling": (
                None if config.importance_sampling is None else config.importance_sampling.level
            ),
            "importance_sampling_cap": (
                2.0 if config.importance_sampling is None else config.importance_sampling.cap
            ),
        }
        if config.value is not None:
            value = config.value

            def critic_targets(model, batch, rows_each):
                # The critic's values at the start of the step, micro-batch by micro-batch; the
                # advantages from them are whitened over the whole step.
                values = per_row_in_micro_batches(
                    lambda part: model.values(part.tokens, part.positions, part.attention_mask), batch, rows_each)
                targets, metrics = ppo_targets(values, batch, gamma=value.gamma, lam=value.lam,
                                               normalize_advantages=value.normalize_advantages)
                extras = {**batch.extras, **{key: getattr(targets, field)
                                             for field, key in _PPO_TARGET_EXTRAS.items()}}
                return batch.replace(extras=extras), metrics

            def actor_critic(model, batch, totals):
                # Producers record log-probs of the temperature-scaled distribution
                # they sampled from; the ratio must compare like with like.
                statistics, hidden = self._statistics(model, batch, temperature=temperature)
                targets = PPOTargets(**{field: batch.extras[key] for field, key in _PPO_TARGET_EXTRAS.items()})
                return ppo_loss(statistics, model.value_head(hidden), batch, targets,
                                value_coef=value.value_coef, value_clip=value.value_clip, totals=totals, **options)

            return StepLoss(actor_critic, prepare=critic_targets)

        def policy_gradient(model, batch, totals):
            statistics, _ = self._statistics(model, batch, temperature=temperature)
            return policy_gradient_loss(statistics, batch, totals=totals, **options)

        return StepLoss(policy_gradient)

    def prepare(self, groups: Sequence[Sequence[TrajectoryRecord]], *, rl_step: int = 0) -> PreparedEpisodes:
        """Filter, shape and score complete groups of episodes (host side).

        ``groups`` are the step's groups, each every episode of one task.
        Failed episodes (``status == "failed"``) never reach the batch and do not
        count in their group's statistics. Dynamic sampling tests the raw
        rewards (before shaping), as DAPO filters on accuracy. The result may
        be empty (every group dropped): skip the update then, or take more
        groups. ``rl_step`` (0-based): where a decaying tool-call bonus stands.
        """
        records = [record for group in groups for record in group]
        group_ids = np.array(
            [index for index, group in enumerate(groups) for _ in group], dtype=np.int32
        )
        num_groups = len(groups)
        raw = np.array([record.reward for record in records], dtype=np.float32)
        # Truncated episodes train with the reward they had when they were cut off.
        valid = np.array([record.status != "failed" for record in records], dtype=np.bool_)
        lengths = np.array([sum(record.loss_mask) for record in records], dtype=np.float32)

        keep_group = np.ones(num_groups, np.bool_)
        if self.config.dynamic_sampling:
            keep_group = groups_with_reward_variance(raw, group_ids, valid, num_groups)

        penalty = np.zeros_like(raw)
        if self._overlong is not None:
            max_length, cache_length = self._overlong
            penalty = overlong_penalty(
                lengths,
                max_length=max_length,
                cache_length=cache_length,
                penalty_factor=self.config.overlong.penalty_factor,
            )
        bonus = np.zeros_like(raw)
        if self.config.tool_call_bonus is not None:
            bonus = np.array([self.config.tool_call_bonus.bonus(record.tool_calls_run(), rl_step=rl_step,
                                                                example_copies=record.example_copies_run())
                              for record in records], dtype=np.float32)
        shaped = raw + penalty + bonus

        advantages = np.zeros_like(raw)
        if self._group_estimator is not None and records:
            advantages = np.asarray(
                self._group_estimator(shaped, group_ids, valid, num_groups),
                dtype=np.float32,
            )

        kept = valid & keep_group[group_ids]
        indices = np.flatnonzero(kept)

        def mean(values: np.ndarray, where: np.ndarray) -> float:
            return float(values[where].mean()) if where.any() else 0.0

        stats = {
            "groups": float(num_groups),
            "groups_dropped": float(num_groups - int(keep_group.sum())),
            "episodes": float(indices.size),
            "episodes_failed": float((~valid).sum()),
            "reward_mean": mean(raw, valid),
            "shaped_reward_mean": mean(shaped, kept),
            "overlong_penalty_mean": mean(penalty, valid),
            "overlong_penalized_fraction": mean((penalty < 0).astype(np.float32), valid),
            "tool_call_bonus_mean": mean(bonus, valid),
            "policy_tokens_mean": mean(lengths, valid),
        }
        return PreparedEpisodes(
            records=tuple(records[i] for i in indices),
            rewards=shaped[indices],
            advantages=advantages[indices],
            stats=stats,
        )

    def batch(
        self,
        prepared: PreparedEpisodes,
        *,
        batch_size: int,
        length_buckets: tuple[int, ...],
        pad_id: int,
        reference: ReferencePolicy | None = None,
        pack_row_multiple: int | None = None,
        pack_row_tokens: int | None = None,
        pack_padding_target: float | None = None,
    ) -> TrainBatch:
        """Pad prepared episodes into a TrainBatch with every extra :attr:`loss_fn` reads.

        Episodes are cut to the largest length bucket. PPO's outcome reward
        goes on the last policy token that survives the cut. With a KL
        penalty, ``reference`` is required and its log-probs are computed
        here, outside the train step. With ``pack_row_multiple`` the episodes are
        packed several to a row (:func:`trainer.train_batch.pack_batch`, rows a multiple of it, of
        ``pack_row_tokens``, of the length ``pack_padding_target`` chooses, or of the longest episode's
        bucket) instead of one to each of ``batch_size`` rows; the losses give the same result.
        """
        if self.needs_reference and reference is None:
            raise ValueError(f"{self.config.name} with a KL penalty needs the reference policy")
        max_len = max(length_buckets)
        records = prepared.records
        masks = [record.loss_mask[:max_len] for record in records]
        token_extras: dict[str, list[list[float]]] = {}
        if self.needs_value_head:
            token_extras[TOKEN_REWARDS] = [_outcome_on_last_policy_token(mask, reward)
                                           for mask, reward in zip(masks, prepared.rewards, strict=True)]
        common = {
            "loss_masks": masks,
            "segment_starts": [record.segment_starts for record in records],
            "behaviour_logprobs": [record.behaviour_logprobs[:max_len] for record in records],
            "advantages": [float(a) for a in prepared.advantages],
            "length_buckets": length_buckets,
            "pad_id": pad_id,
            "token_extras": token_extras,
        }
        sequences = [record.token_ids[:max_len] for record in records]
        if pack_row_multiple is not None:
            batch = pack_batch(sequences, **common, row_multiple=pack_row_multiple, row_tokens=pack_row_tokens,
                               padding_target=pack_padding_target, micro_batch_tokens=self.micro_batch_tokens)
        else:
            batch = pad_batch(sequences, **common, batch_size=batch_size)
        extras = dict(batch.extras)
        if self.needs_reference:
            extras[REFERENCE_LOGPROBS] = reference.logprobs(batch, temperature=self.temperature,
                                                            logits_chunk_tokens=self.logits_chunk_tokens,
                                                            micro_batch_tokens=self.micro_batch_tokens)
        return batch.replace(extras=extras)


def _outcome_on_last_policy_token(mask: list[int], reward: float) -> list[float]:
    """A sequence's token rewards: its outcome ``reward`` on its last policy token, 0 elsewhere (and
    everywhere, for a sequence without one)."""
    rewards = [0.0] * len(mask)
    policy_slots = np.flatnonzero(np.asarray(mask))
    if policy_slots.size:
        rewards[int(policy_slots[-1])] = float(reward)
    return rewards


def build_algorithm(
    config: AlgorithmConfig,
    *,
    temperature: float = 1.0,
    max_policy_tokens: int | None = None,
    logits_chunk_tokens: int = DEFAULT_LOGITS_CHUNK_TOKENS,
    remat: str = "none",
    micro_batch_tokens: int | None = None,
    attention_query_chunk: int | None = None,
) -> Algorithm:
    """The algorithm ``config`` describes.

    Args:
      config: the run's algorithm section.
      temperature: the producers' sampling temperature; RL losses divide the
        logits by it, since behaviour log-probs are of the tempered
        distribution (SFT ignores it).
      max_policy_tokens: the most tokens the policy can generate in one
        episode (``sampling.max_new_tokens * rollout.max_turns``). The default of
        ``overlong.max_length`` and of ``token_sum_length``; required when
        one of them is used and not set.
      logits_chunk_tokens: tokens whose logits exist at once (trainer/token_statistics.py).
      remat: what the backward pass keeps of each block (``policy.REMAT_POLICIES``).
      attention_query_chunk: queries of a row its trained forward attends at once (``memory.attention_query_chunk_tokens``).
      micro_batch_tokens: the train step's micro-batch budget, which the reference's forward pass keeps too.
    Raises:
      ValueError: a length the config needs is missing.
    """
    return Algorithm(config, temperature=temperature, max_policy_tokens=max_policy_tokens,
                     logits_chunk_tokens=logits_chunk_tokens, remat=remat, micro_batch_tokens=micro_batch_tokens,
                     attention_query_chunk=attention_query_chunk)
