"""The typed configuration of a run's post-training algorithm.

``name`` picks the advantage estimator and the defaults of every other knob;
any knob may be overridden. Validation resolves the preset, so a validated
config (and its JSON dump, as stored, shown and diffed) states every value
the trainer uses, and re-validating a dump changes nothing::

    AlgorithmConfig(name="dapo")
    # == AlgorithmConfig(name="dapo", epsilon_low=0.2, epsilon_high=0.28,
    #                    loss_aggregation="token_mean", dynamic_sampling=True,
    #                    overlong=OverlongShapingConfig(), ...)

Presets (what each ``name`` sets when the field is not given):

========  ==================  ===================  ===============================
name      advantages          aggregation          other defaults
========  ==================  ===================  ===============================
sft       none (likelihood)   token mean           no RL knobs allowed
grpo      (r - mean) / std    token_mean           epsilon 0.2 / 0.2
dr_grpo   r - mean            token_sum            epsilon 0.2 / 0.2
dapo      (r - mean) / std    token_mean           epsilon 0.2 / 0.28, overlong
                                                   shaping, dynamic sampling
rloo      r - mean(others)    token_mean           epsilon 0.2 / 0.2
ppo       token GAE + value   token_mean           value head (``value``)
========  ==================  ===================  ===============================

References: GRPO (Shao et al., 2024, DeepSeekMath), Dr. GRPO (Liu et al.,
2025, "Understanding R1-Zero-Like Training"), DAPO (Yu et al., 2025), RLOO
(Ahmadian et al., 2024), PPO (Schulman et al., 2017) with GAE (Schulman et
al., 2016), truncated importance sampling (Yao et al., 2025, "Your efficient
RL framework secretly brings you off-policy RL training"; decoupled PPO of
Hilton et al., 2021, as in AReaL and verl).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

AlgorithmName = Literal["sft", "grpo", "dr_grpo", "dapo", "rloo", "ppo"]
AdvantageEstimator = Literal["none", "grpo", "dr_grpo", "rloo", "gae"]
LossAggregation = Literal["token_mean", "seq_mean_token_mean", "token_sum"]


class KLPenaltyConfig(BaseModel):
    """A KL penalty to a frozen reference policy, added to the loss.

    The reference log-probs are computed by the run loop outside the train
    step (``trainer.algorithms.reference_logprobs``) and reach the loss as
    ``batch.extras["reference_logprobs"]``.
    """

    model_config = ConfigDict(extra="forbid")

    coef: float = Field(
        0.001, ge=0, le=100, description="Weight of the KL term in the loss (GRPO paper: 0.04)."
    )
    estimator: Literal["k1", "k3"] = Field(
        "k3",
        description=(
            "Per-token estimator of KL(policy || reference) (Schulman, 'Approximating KL "
            "divergence'): k1 = logp - ref_logp; k3 = exp(ref_logp - logp) - (ref_logp - logp) - 1, "
            "non-negative and lower variance, as in GRPO."
        ),
    )


class ToolCallBonusConfig(BaseModel):
    """A reward for calling the environment's tools, to start a model that never calls them.

    An episode earns ``per_call`` for each call that parsed, named a declared tool with arguments its
    schema accepts, and ran without the tool refusing it, up to ``max_per_episode``; markup that made
    no call and refused calls earn nothing. A call whose arguments are the example its tool's schema
    declares (the example call the tool instructions show) earns ``example_copy_share`` of ``per_call``:
    paid in full, a policy learns to copy the example and not to do the task (bench/README.md, issue 31);
    paid less than a call of its own, copying is a first rung that the policy climbs from. From the
    first RL step the bonus shrinks linearly to 0 at step ``decay_steps`` (None: it never shrinks), so
    the task's own reward is what the policy ends up trained on. It is added to the reward the
    advantages are computed from and reported apart (``tool_call_bonus_mean``); ``reward_mean`` stays
    the environment's alone.
    """

    model_config = ConfigDict(extra="forbid")

    per_call: float = Field(0.1, gt=0, le=1, description="Reward per call that ran.")
    max_per_episode: float = Field(0.2, gt=0, le=1, description="The most one episode earns of the bonus.")
    example_copy_share: float = Field(
        0.5, ge=0, le=1, description="The share of per_call that a call copying its tool's example earns; 0: none.")
    decay_steps: int | None = Field(
        None, ge=1, description="RL steps over which the bonus shrinks linearly to 0; None: it stays whole.")

    def bonus(self, calls_run: int, *, rl_step: int, example_copies: int = 0) -> float:
        """The bonus of an episode with ``calls_run`` calls that ran, ``example_copies`` of them copies of their
        tool's example, at RL step ``rl_step`` (0-based)."""
        scale = 1.0 if self.decay_steps is None else max(0.0, 1.0 - rl_step / self.decay_steps)
        calls_earning = calls_run - example_copies + self.example_copy_share * example_copies
        return min(self.per_call * calls_earning, self.max_per_episode) * scale


class OverlongShapingConfig(BaseModel):
    """DAPO's soft overlong punishment, added to each episode's reward.

    Length ``L`` is the number of tokens the policy generated in the episode
    (its loss-masked tokens, over all turns; prompt, tool and environment
    tokens do not count). With ``L_max = max_length`` and ``L_cache =
    cache_length``, the added reward is ``penalty_factor`` times::

        0                                  if L <= L_max - L_cache
        ((L_max - L_cache) - L) / L_cache  if L_max - L_cache < L <= L_max
        -1                                 if L > L_max
    """

    model_config = ConfigDict(extra="forbid")

    max_length: int | None = Field(
        None,
        ge=1,
        description=(
            "L_max, in policy tokens. None: the episode's policy-token budget the trainer "
            "was built with (sampling.max_new_tokens x rollout.max_turns)."
        ),
    )
    cache_length: int | None = Field(
        None,
        ge=1,
        description=(
            "L_cache, the soft band below L_max, in policy tokens. None: 20% of L_max "
            "(DAPO's 4096 of 20480), at least 1."
        ),
    )
    penalty_factor: float = Field(
        1.0, ge=0, le=100, description="Scale of the penalty; the full penalty is -penalty_factor."
    )


class ImportanceSamplingConfig(BaseModel):
    """Truncated importance sampling (TIS) against the producers' behaviour policy.

    Producers sample with weights up to a few versions old, so the trainer
    corrects with the weight ``min(pi_old / pi_behaviour, cap)``, where
    ``pi_old`` is the trainer's policy at the start of the step (the
    "proximal" policy of decoupled PPO). Tandem makes one update per batch,
    so ``pi_old`` is the current parameters under ``stop_gradient`` and the
    PPO ratio ``pi_theta / pi_old`` is 1 in value (the clip then bounds
    nothing within the step; the truncated weight carries the off-policy
    correction). Without this section the PPO ratio is taken against the
    behaviour policy directly and clipped, as in plain GRPO.
    """

    model_config = ConfigDict(extra="forbid")

    level: Literal["token", "sequence"] = Field(
        "token",
        description=(
            "token: one weight per token, exp(logp_old - logp_behaviour); sequence: one weight "
            "per episode, exp(sum over its policy tokens of logp_old - logp_behaviour)."
        ),
    )
    cap: float = Field(
        2.0, gt=0, le=1e6, description="Truncation C: weights above it are set to it (verl: 2.0)."
    )


class ValueConfig(BaseModel):
    """PPO's critic: a linear value head on the policy's final hidden states, and GAE."""

    model_config = ConfigDict(extra="forbid")

    gamma: float = Field(
        1.0, ge=0, le=1, description="Discount per policy token (tool tokens are not steps)."
    )
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda: 0 is TD(0), 1 is Monte Carlo.")
    value_coef: float = Field(
        0.1,
        ge=0,
        le=100,
        description="Weight of the value loss; small, as the head shares the policy's trunk (TRL: 0.1).",
    )
    value_clip: float = Field(
        0.2,
        gt=0,
        le=1e6,
        description="Clip range of the value prediction around the old value (PPO2 value clipping).",
    )
    normalize_advantages: bool = Field(
        True, description="Whiten GAE advantages over the batch's policy tokens (mean 0, std 1)."
    )


_ESTIMATORS: dict[str, AdvantageEstimator] = {
    "sft": "none",
    "grpo": "grpo",
    "dr_grpo": "dr_grpo",
    "dapo": "grpo",
    "rloo": "rloo",
    "ppo": "gae",
}

# Defaults by name; a field the caller gives always wins.
_PRESETS: dict[str, dict[str, Any]] = {
    "sft": {},
    "grpo": {},
    "dr_grpo": {"loss_aggregation": "token_sum"},
    "dapo": {
        "epsilon_high": 0.28,
        "loss_aggregation": "token_mean",
        "overlong": {},
        "dynamic_sampling": True,
    },
    "rloo": {},
    "ppo": {"value": {}},
}


class AlgorithmConfig(BaseModel):
    """The post-training algorithm of a run's RL phase and its hyperparameters."""

    model_config = ConfigDict(extra="forbid")

    name: AlgorithmName = Field(
        "grpo",
        description="Algorithm; picks the advantage estimator and the defaults of the fields below.",
    )
    epsilon_low: float = Field(
        0.2,
        gt=0,
        lt=1,
        description="Lower clip range: the ratio is clipped below at 1 - epsilon_low.",
    )
    epsilon_high: float = Field(
        0.2,
        gt=0,
        le=10,
        description="Upper clip range: the ratio is clipped above at 1 + epsilon_high (DAPO clip-higher: 0.28).",
    )
    loss_aggregation: LossAggregation = Field(
        "token_mean",
        description=(
            "How per-token losses become one number. token_mean: sum over the batch's policy "
            "tokens / their count. seq_mean_token_mean: mean over each episode's policy tokens, "
            "then mean over episodes that have any (original GRPO). token_sum: sum over policy "
            "tokens / (token_sum_length x episodes that have any), Dr. GRPO's constant normaliser "
            "that does not favour short answers."
        ),
    )
    token_sum_length: int | None = Field(
        None,
        ge=1,
        description=(
            "The per-episode length of the token_sum normaliser. None: the episode's policy-token "
            "budget the trainer was built with (Dr. GRPO divides by the maximum generation length)."
        ),
    )
    updates_per_batch: int = Field(
        1,
        ge=1,
        le=64,
        description=(
            "Optimizer updates on each RL step's batch before the next policy version is published "
            "(GRPO's mu). From the second update on, the clipped ratio to the behaviour log-probs "
            "keeps the policy near the one that sampled the batch. Only 1 with importance_sampling "
            "(whose ratio is to the current policy) and with ppo (whose critic would move under its "
            "own advantages): neither would be clipped across updates."
        ),
    )
    advantage_eps: float = Field(
        1e-6, gt=0, le=1, description="Added to the group std of grpo/dapo advantages."
    )
    kl: KLPenaltyConfig | None = Field(
        None,
        description="KL penalty to the reference policy; None disables it (and the reference).",
    )
    overlong: OverlongShapingConfig | None = Field(
        None, description="DAPO overlong reward shaping; None disables it."
    )
    tool_call_bonus: ToolCallBonusConfig | None = Field(
        None, description="A reward for each call of the environment's tools that ran (capped, optionally "
        "decaying), to start a policy that never calls them; None disables it."
    )
    dynamic_sampling: bool = Field(
        False,
        description=(
            "DAPO dynamic sampling: drop groups whose raw rewards (before shaping) have zero "
            "variance over their successful episodes; they carry no group-relative signal."
        ),
    )
    importance_sampling: ImportanceSamplingConfig | None = Field(
        None,
        description="Truncated importance-sampling correction for stale producers; None disables it.",
    )
    value: ValueConfig | None = Field(
        None, description="Critic and GAE of ppo (required there, refused elsewhere)."
    )

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        name = data.get("name", "grpo")
        # An unknown name gets no preset; the field's own validation then names it.
        preset = _PRESETS.get(name, {}) if isinstance(name, str) else {}
        return {**preset, **data}

    @model_validator(mode="after")
    def _consistent(self):
        if self.name == "sft":
            rl_only = {
                "kl": self.kl is not None,
                "overlong": self.overlong is not None,
                "dynamic_sampling": self.dynamic_sampling,
                "importance_sampling": self.importance_sampling is not None,
                "value": self.value is not None,
            }
            given = [field for field, on in rl_only.items() if on]
            if given:
                raise ValueError(f"sft does not use {', '.join(given)}")
        if self.name == "ppo" and self.value is None:
            raise ValueError("ppo needs a value section")
        if self.name != "ppo" and self.value is not None:
            raise ValueError(f"value is only used by ppo, not {self.name}")
        if self.updates_per_batch > 1 and self.importance_sampling is not None:
            raise ValueError("updates_per_batch above 1 needs importance_sampling off: its ratio is to the "
                             "current policy, so nothing would clip the later updates")
        if self.updates_per_batch > 1 and self.name == "ppo":
            raise ValueError("updates_per_batch above 1 is not offered for ppo: its old values and "
                             "advantages are taken inside each update, so value_clip would never act")
        if self.token_sum_length is not None and self.loss_aggregation != "token_sum":
            raise ValueError("token_sum_length is only used with loss_aggregation='token_sum'")
        if (
            self.overlong is not None
            and self.overlong.max_length is not None
            and self.overlong.cache_length is not None
            and self.overlong.cache_length > self.overlong.max_length
        ):
            raise ValueError("overlong.cache_length must not exceed overlong.max_length")
        return self

    @property
    def advantage_estimator(self) -> AdvantageEstimator:
        """The estimator ``name`` implies: none, grpo, dr_grpo, rloo or gae."""
        return _ESTIMATORS[self.name]
