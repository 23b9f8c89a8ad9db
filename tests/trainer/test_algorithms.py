"""Algorithm configs, host-side preparation, advantages and GAE against hand computations
(tolerance 1e-5 unless stated), and one training run per algorithm on a tiny Transformer."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from pydantic import ValidationError

from policy.model import Transformer, TransformerConfig, split_model
from tandem.configs.algorithm import AlgorithmConfig
from tandem.contracts import EpisodeTimings, TrajectoryRecord
from trainer.advantages import (
    dr_grpo_advantages,
    gae_advantages,
    groups_with_reward_variance,
    overlong_penalty,
    rloo_advantages,
)
from trainer.algorithms import ReferencePolicy, build_algorithm, reference_logprobs
from trainer.losses import token_logprobs
from trainer.train_batch import pad_batch
from trainer.train_state import create_train_state
from trainer.train_step import make_train_step
from trainer.value_head import PolicyWithValue, policy_params, with_value_head

TOLERANCE = 1e-5
CONFIG = TransformerConfig(
    vocab_size=16, d_model=32, num_layers=1, num_heads=2, mlp_dim=64, max_seq_len=32
)
BUCKETS = (16,)
PAD_ID = 0


def _record(
    tokens, mask, reward, *, status="ok", behaviour=None, group="g", group_size=2
) -> TrajectoryRecord:
    return TrajectoryRecord(
        run_id=1,
        group_id=group,
        group_size=group_size,
        environment="test",
        policy_version=0,
        token_ids=list(tokens),
        behaviour_logprobs=list(behaviour) if behaviour is not None else [0.0] * len(tokens),
        loss_mask=list(mask),
        reward=reward,
        status=status,
        timings=EpisodeTimings(
            started_at=0.0, finished_at=1.0, generation_s=0.5, environment_s=0.5
        ),
    )


def _with_policy_tokens(count: int, reward: float, **kwargs) -> TrajectoryRecord:
    """A 2-token prompt followed by ``count`` policy tokens."""
    return _record([1, 2] + [3] * count, [0, 0] + [1] * count, reward, **kwargs)


# -- config ----------------------------------------------------------------------


def test_presets_resolve_into_explicit_values_that_round_trip():
    dapo = AlgorithmConfig(name="dapo")
    assert dapo.epsilon_low == 0.2 and dapo.epsilon_high == 0.28
    assert dapo.loss_aggregation == "token_mean"
    assert dapo.dynamic_sampling and dapo.overlong is not None
    assert dapo.advantage_estimator == "grpo"
    assert AlgorithmConfig.model_validate(dapo.model_dump(mode="json")) == dapo

    assert AlgorithmConfig(name="dr_grpo").loss_aggregation == "token_sum"
    assert AlgorithmConfig(name="ppo").value is not None
    default = AlgorithmConfig()
    assert default.name == "grpo" and default.epsilon_high == 0.2 and default.kl is None

    # Given fields win over the preset, including an explicit None.
    custom = AlgorithmConfig.model_validate(
        {"name": "dapo", "epsilon_high": 0.3, "overlong": None, "kl": {"estimator": "k1"}}
    )
    assert custom.epsilon_high == 0.3 and custom.overlong is None and custom.dynamic_sampling
    assert custom.kl is not None and custom.kl.estimator == "k1"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "sft", "kl": {}}, "sft does not use kl"),
        ({"name": "grpo", "value": {}}, "only used by ppo"),
        ({"name": "ppo", "value": None}, "ppo needs a value section"),
        ({"name": "grpo", "token_sum_length": 8}, "token_sum_length"),
        ({"name": "grpo", "epsilon_low": 1.0}, "epsilon_low"),
        ({"name": "grpo", "overlong": {"max_length": 4, "cache_length": 5}}, "cache_length"),
        ({"name": "reinforce"}, "name"),
        ({"name": "grpo", "updates_per_batch": 0}, "updates_per_batch"),
        ({"name": "grpo", "updates_per_batch": 2, "importance_sampling": {}}, "updates_per_batch above 1 needs"),
        ({"name": "ppo", "value": {}, "updates_per_batch": 2}, "not offered for ppo"),
    ],
)
def test_inconsistent_configs_are_refused_naming_the_field(fields, message):
    with pytest.raises(ValidationError, match=message):
        AlgorithmConfig.model_validate(fields)


def test_algorithms_declare_the_reference_value_head_and_extras_they_need():
    grpo = build_algorithm(AlgorithmConfig())
    assert (grpo.needs_reference, grpo.needs_value_head, grpo.extras_keys) == (False, False, ())
    with_kl = build_algorithm(AlgorithmConfig(name="rloo", kl={"coef": 0.1}))
    assert with_kl.needs_reference and with_kl.extras_keys == ("reference_logprobs",)
    ppo = build_algorithm(AlgorithmConfig(name="ppo"))
    assert ppo.needs_value_head and ppo.extras_keys == ("token_rewards",)
    # Lengths that default to the episode's token budget need it.
    with pytest.raises(ValueError, match="max_policy_tokens"):
        build_algorithm(AlgorithmConfig(name="dr_grpo"))
    with pytest.raises(ValueError, match="max_policy_tokens"):
        build_algorithm(AlgorithmConfig(name="dapo"))
    build_algorithm(AlgorithmConfig(name="dr_grpo", token_sum_length=64))


# -- advantages and shaping --------------------------------------------------------

REWARDS = jnp.array([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 5.0, 3.0, 1.0])
GROUP_IDS = jnp.array([0, 0, 0, 0, 1, 1, 1, 2, 2], jnp.int32)
VALID = jnp.array([True, True, True, True, True, True, False, True, True])


def test_dr_grpo_advantages_subtract_the_group_mean_without_dividing_by_the_std():
    advantages = dr_grpo_advantages(REWARDS, GROUP_IDS, VALID, num_groups=3)
    # Group means over valid members: 0.25, 2 (the invalid 5 is ignored), 2.
    np.testing.assert_allclose(
        advantages, [0.75, -0.25, -0.25, -0.25, 0.0, 0.0, 0.0, 1.0, -1.0], atol=TOLERANCE
    )


def test_rloo_advantages_subtract_the_mean_of_the_other_members():
    advantages = rloo_advantages(REWARDS, GROUP_IDS, VALID, num_groups=3)
    # Group 0: 1 - (0 + 0 + 0) / 3 = 1 and 0 - (1 + 0 + 0) / 3 = -1/3.
    # Group 1: 2 - 2 = 0 twice; the invalid row gets 0. Group 2: 3 - 1 = 2, 1 - 3 = -2.
    np.testing.assert_allclose(
        advantages, [1.0, -1 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0, 2.0, -2.0], atol=TOLERANCE
    )
    lone = rloo_advantages(
        jnp.array([7.0, 1.0]), jnp.array([0, 0], jnp.int32), jnp.array([True, False]), 1
    )
    np.testing.assert_allclose(lone, [0.0, 0.0], atol=TOLERANCE)


def test_overlong_penalty_at_and_around_its_boundaries():
    # L_max = 10, L_cache = 4: no penalty up to 6, linear to -1 at 10, -1 beyond.
    lengths = np.array([0, 6, 7, 8, 10, 11, 20])
    np.testing.assert_allclose(
        overlong_penalty(lengths, max_length=10, cache_length=4),
        [0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0],
        atol=TOLERANCE,
    )
    np.testing.assert_allclose(
        overlong_penalty(lengths, max_length=10, cache_length=4, penalty_factor=0.5),
        [0.0, 0.0, -0.125, -0.25, -0.5, -0.5, -0.5],
        atol=TOLERANCE,
    )


def test_dynamic_sampling_keeps_only_groups_with_reward_variance():
    rewards = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.7])
    group_ids = np.array([0, 0, 1, 1, 2, 2, 3, 3, 3])
    # Group 2's only other member failed, so it has a single valid reward.
    valid = np.array([True, True, True, True, True, False, True, True, True])
    keep = groups_with_reward_variance(rewards, group_ids, valid, num_groups=4)
    np.testing.assert_array_equal(keep, [True, False, False, True])


def test_gae_over_four_policy_tokens_skips_the_tool_token_between_them():
    # Row 0: policy tokens at 0, 1, 3, 4; slot 2 is a tool token whose value and reward
    # must be ignored. Row 1 is padding.
    rewards = jnp.array([[0.0, 0.0, 7.0, 0.0, 1.0], [5.0] * 5])
    values = jnp.array([[0.5, 0.4, 9.0, 0.6, 0.8], [1.0] * 5])
    mask = jnp.array([[1.0, 1.0, 0.0, 1.0, 1.0], [0.0] * 5])

    advantages, returns = gae_advantages(rewards, values, mask, gamma=0.9, lam=0.8)

    # Backwards, gamma * lam = 0.72:
    #   t=4: delta = 1 + 0.9 * 0 - 0.8 = 0.2;      A = 0.2
    #   t=3: delta = 0 + 0.9 * 0.8 - 0.6 = 0.12;   A = 0.12 + 0.72 * 0.2 = 0.264
    #   t=1: delta = 0 + 0.9 * 0.6 - 0.4 = 0.14;   A = 0.14 + 0.72 * 0.264 = 0.33008
    #   t=0: delta = 0 + 0.9 * 0.4 - 0.5 = -0.14;  A = -0.14 + 0.72 * 0.33008 = 0.0976576
    np.testing.assert_allclose(
        advantages, [[0.0976576, 0.33008, 0.0, 0.264, 0.2], [0.0] * 5], atol=TOLERANCE
    )
    np.testing.assert_allclose(
        returns, [[0.5976576, 0.73008, 0.0, 0.864, 1.0], [0.0] * 5], atol=TOLERANCE
    )


# -- prepare and batch ---------------------------------------------------------------


def test_dapo_prepare_drops_groups_on_raw_rewards_and_shapes_the_survivors():
    config = AlgorithmConfig(name="dapo", overlong={"max_length": 10, "cache_length": 4})
    algorithm = build_algorithm(config)
    groups = [
        # Raw rewards equal: dropped, although shaping (lengths 6 and 8) would split them.
        [_with_policy_tokens(6, 1.0), _with_policy_tokens(8, 1.0)],
        # Lengths 7 and 2: shaped rewards 1 - 0.25 = 0.75 and 0.
        [_with_policy_tokens(7, 1.0), _with_policy_tokens(2, 0.0)],
        # A failed episode stays out of statistics and batch; the rest has variance.
        [
            _with_policy_tokens(3, 1.0),
            _with_policy_tokens(3, 0.0),
            _with_policy_tokens(3, 1.0, status="failed"),
        ],
    ]

    prepared = algorithm.prepare(groups)

    assert prepared.records == (groups[1][0], groups[1][1], groups[2][0], groups[2][1])
    np.testing.assert_allclose(prepared.rewards, [0.75, 0.0, 1.0, 0.0], atol=TOLERANCE)
    # GRPO advantages: group 1 has mean 0.375 and std 0.375; group 2 mean 0.5, std 0.5.
    np.testing.assert_allclose(prepared.advantages, [1.0, -1.0, 1.0, -1.0], atol=1e-4)
    assert prepared.stats["groups"] == 3
    assert prepared.stats["groups_dropped"] == 1
    assert prepared.stats["episodes"] == 4
    assert prepared.stats["episodes_failed"] == 1
    # Penalties of the 6 successful episodes: 0, -0.5, -0.25, 0, 0, 0.
    np.testing.assert_allclose(prepared.stats["overlong_penalty_mean"], -0.125, atol=TOLERANCE)
    np.testing.assert_allclose(prepared.stats["overlong_penalized_fraction"], 2 / 6, atol=TOLERANCE)


def _calling(reward: float, *outcomes: str | None, calls_each: int = 1, status: str = "ok",
             copies_example: bool = False) -> TrajectoryRecord:
    """An episode whose assistant turns had these tool-call outcomes (None: an answer)."""
    from tandem.contracts import ConversationMessage, MessageToolCall

    messages = tuple(ConversationMessage(
        role="assistant", content="...", start=0, end=1, tool_call_status=outcome,
        tool_calls=tuple(MessageToolCall(name="calc", copies_example=copies_example)
                         for _ in range(calls_each if outcome in ("ok", "tool_error") else 0)))
        for outcome in outcomes)
    return _with_policy_tokens(3, reward, status=status).model_copy(
        update={"messages": messages, "offered_tools": ("calc",)})


def test_the_tool_call_bonus_pays_calls_that_ran_capped_and_decaying_and_never_failed_ones():
    config = AlgorithmConfig(name="grpo", tool_call_bonus={"per_call": 0.1, "max_per_episode": 0.25,
                                                           "decay_steps": 10})
    algorithm = build_algorithm(config)
    group = [
        _calling(0.0, "ok", None),                           # one call that ran: 0.1
        _calling(1.0, "ok", "ok", None, calls_each=2),       # four calls: capped at 0.25
        _calling(0.0, "unparsed", "unknown_tool", "invalid_arguments", None),  # none made: 0
        _calling(0.0, "tool_error", None),                   # refused by the tool: 0
        _calling(0.0, None),                                 # answered from memory: 0
    ]
    at_start = algorithm.prepare([group], rl_step=0)
    np.testing.assert_allclose(at_start.rewards, [0.1, 1.25, 0.0, 0.0, 0.0], atol=TOLERANCE)
    assert at_start.stats["reward_mean"] == pytest.approx(0.2)  # the task's reward alone
    assert at_start.stats["tool_call_bonus_mean"] == pytest.approx(0.35 / 5)
    halfway = algorithm.prepare([group], rl_step=5)
    np.testing.assert_allclose(halfway.rewards, [0.05, 1.125, 0.0, 0.0, 0.0], atol=TOLERANCE)
    spent = algorithm.prepare([group], rl_step=10)
    np.testing.assert_allclose(spent.rewards, [0.0, 1.0, 0.0, 0.0, 0.0], atol=TOLERANCE)
    assert spent.stats["tool_call_bonus_mean"] == 0.0
    # Without the setting, nothing is added.
    plain = build_algorithm(AlgorithmConfig(name="grpo")).prepare([group])
    np.testing.assert_allclose(plain.rewards, [0.0, 1.0, 0.0, 0.0, 0.0], atol=TOLERANCE)


def test_the_tool_call_bonus_pays_a_copy_of_the_tools_example_less_than_a_call_of_its_own():
    group = [
        _calling(0.0, "ok", None, copies_example=True),  # the instructions' example, word for word
        _calling(1.0, "ok", None),                       # its own call
        _calling(0.0, "ok", "ok", None, copies_example=True),  # two copies: still under the cap
    ]
    halved = build_algorithm(AlgorithmConfig(name="grpo", tool_call_bonus={"per_call": 0.1})).prepare([group])
    np.testing.assert_allclose(halved.rewards, [0.05, 1.1, 0.1], atol=TOLERANCE)
    assert halved.stats["tool_call_bonus_mean"] == pytest.approx(0.25 / 3)
    unpaid = build_algorithm(AlgorithmConfig(name="grpo", tool_call_bonus={"per_call": 0.1,
                                                                           "example_copy_share": 0})).prepare([group])
    np.testing.assert_allclose(unpaid.rewards, [0.0, 1.1, 0.0], atol=TOLERANCE)
    # The copy still ran: the tool-use metrics count it as a call.
    assert group[0].tool_calls_run() == 1 and group[0].example_copies_run() == 1


def test_a_tool_call_bonus_setting_names_its_field_when_out_of_range():
    with pytest.raises(ValidationError, match="tool_call_bonus.per_call"):
        AlgorithmConfig(name="grpo", tool_call_bonus={"per_call": 0})


def test_prepare_without_dynamic_sampling_keeps_zero_variance_groups():
    algorithm = build_algorithm(AlgorithmConfig(name="rloo"))
    groups = [
        [_with_policy_tokens(2, 1.0), _with_policy_tokens(2, 1.0)],
        [_with_policy_tokens(2, 3.0), _with_policy_tokens(2, 1.0), _with_policy_tokens(2, 2.0)],
    ]
    prepared = algorithm.prepare(groups)
    assert prepared.stats["groups_dropped"] == 0
    # RLOO: 3 - 1.5, 1 - 2.5, 2 - 2.
    np.testing.assert_allclose(prepared.advantages, [0.0, 0.0, 1.5, -1.5, 0.0], atol=TOLERANCE)
    empty = build_algorithm(AlgorithmConfig(name="grpo", dynamic_sampling=True)).prepare(groups[:1])
    assert empty.records == () and empty.stats["groups_dropped"] == 1


def test_ppo_batch_puts_the_reward_on_the_last_policy_token_that_survives_truncation():
    algorithm = build_algorithm(AlgorithmConfig(name="ppo"))
    short = _record([1, 2, 3, 4, 5], [0, 1, 1, 0, 0], 2.0)  # a trailing tool turn
    long = _record(list(range(1, 11)), [0, 0, 0, 1, 1, 1, 1, 1, 1, 1], -1.0)
    prepared = algorithm.prepare([[short, long]])

    batch = algorithm.batch(prepared, batch_size=3, length_buckets=(4, 8), pad_id=PAD_ID)

    rewards = np.asarray(batch.extras["token_rewards"])
    assert rewards.shape == (3, 8)
    expected = np.zeros((3, 8), np.float32)
    expected[0, 2] = 2.0
    expected[1, 7] = -1.0  # cut at 8 tokens: slot 7 is its last policy token left
    np.testing.assert_allclose(rewards, expected, atol=TOLERANCE)
    np.testing.assert_allclose(batch.advantages, 0.0)


def test_reference_logprobs_follow_the_behaviour_convention_and_are_required_for_kl():
    model = Transformer(CONFIG, rngs=nnx.Rngs(0))
    graphdef, params = split_model(model)
    algorithm = build_algorithm(AlgorithmConfig(kl={"coef": 0.1}), temperature=2.0)
    prepared = algorithm.prepare(
        [[_record([1, 2, 3, 4], [0, 1, 0, 1], 1.0), _record([1, 5, 6], [0, 1, 1], 0.0)]]
    )
    with pytest.raises(ValueError, match="reference"):
        algorithm.batch(prepared, batch_size=2, length_buckets=BUCKETS, pad_id=PAD_ID)

    batch = algorithm.batch(
        prepared,
        batch_size=2,
        length_buckets=BUCKETS,
        pad_id=PAD_ID,
        reference=ReferencePolicy(graphdef, params),
    )

    @jax.jit
    def by_hand(params, batch):
        logits = nnx.merge(graphdef, params)(batch.tokens, batch.positions, batch.attention_mask)
        logprobs = token_logprobs(logits[:, :-1] / 2.0, batch.tokens[:, 1:])
        return logprobs * batch.loss_mask[:, 1:]

    expected = np.zeros(batch.tokens.shape, np.float32)
    expected[:, 1:] = by_hand(params, batch)
    np.testing.assert_allclose(batch.extras["reference_logprobs"], expected, atol=TOLERANCE)
    assert float(batch.extras["reference_logprobs"][0, 2]) == 0.0  # a tool token
    assert float(batch.extras["reference_logprobs"][0, 3]) < 0.0


# -- value head -------------------------------------------------------------------------


def test_policy_with_value_returns_the_policy_logits_and_zero_initial_values():
    policy = Transformer(CONFIG, rngs=nnx.Rngs(0))
    model = with_value_head(policy, d_model=CONFIG.d_model, rngs=nnx.Rngs(1))
    tokens = jnp.array([[1, 2, 3, 4]], jnp.int32)
    positions = jnp.arange(4, dtype=jnp.int32)[None]
    attention_mask = jnp.ones((1, 4), jnp.bool_)

    logits, values = model.logits_and_values(tokens, positions, attention_mask)

    np.testing.assert_allclose(logits, policy(tokens, positions, attention_mask), atol=TOLERANCE)
    np.testing.assert_allclose(model(tokens, positions, attention_mask), logits, atol=TOLERANCE)
    assert values.shape == (1, 4) and values.dtype == jnp.float32
    np.testing.assert_allclose(values, 0.0)
    np.testing.assert_allclose(model.values(tokens, positions, attention_mask), values)

    # The policy's part of the params is exactly what a bare policy splits into.
    _, params = split_model(model)
    bare_graphdef, bare_params = split_model(policy)
    assert jax.tree.structure(policy_params(params)) == jax.tree.structure(bare_params)
    merged = nnx.merge(bare_graphdef, policy_params(params))
    np.testing.assert_allclose(merged(tokens, positions, attention_mask), logits, atol=TOLERANCE)


# -- end to end: every algorithm trains through make_train_step ---------------------


def _episodes() -> list[tuple[list[int], list[int], float, int]]:
    """(tokens, loss mask, reward, group) of 10 episodes: 2-token prompts, a tool token
    after the first policy turn, groups 0 and 1 with reward variance, group 2 without."""
    rng = np.random.default_rng(0)
    rewards = [[1.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.5, 0.0], [1.0, 1.0]]
    episodes = []
    for group, group_rewards in enumerate(rewards):
        for reward in group_rewards:
            first, second = int(rng.integers(2, 5)), int(rng.integers(1, 4))
            tokens = [1, 2, *rng.integers(3, 16, first), 2, *rng.integers(3, 16, second)]
            mask = [0, 0] + [1] * first + [0] + [1] * second
            episodes.append(([int(t) for t in tokens], mask, reward, group))
    return episodes


def _on_policy_groups(graphdef, params) -> list[list[TrajectoryRecord]]:
    """The episodes with behaviour log-probs of the initial policy, as producers record them."""
    episodes = _episodes()
    probe = pad_batch(
        [tokens for tokens, _, _, _ in episodes],
        loss_masks=[mask for _, mask, _, _ in episodes],
        behaviour_logprobs=None,
        advantages=None,
        batch_size=len(episodes),
        length_buckets=BUCKETS,
        pad_id=PAD_ID,
    )
    behaviour = np.asarray(reference_logprobs(graphdef, params, probe))
    groups: list[list[TrajectoryRecord]] = [[], [], []]
    for row, (tokens, mask, reward, group) in enumerate(episodes):
        groups[group].append(
            _record(tokens, mask, reward, behaviour=behaviour[row, : len(tokens)].tolist())
        )
    return groups


ALGORITHMS = {
    "sft": {"name": "sft"},
    "grpo": {"name": "grpo"},
    "grpo_kl_token_tis": {
        "name": "grpo",
        "kl": {"coef": 0.05, "estimator": "k3"},
        "importance_sampling": {"level": "token", "cap": 2.0},
    },
    "dr_grpo": {"name": "dr_grpo"},
    "dapo": {"name": "dapo"},
    "rloo_sequence_tis": {
        "name": "rloo",
        "loss_aggregation": "seq_mean_token_mean",
        "importance_sampling": {"level": "sequence", "cap": 2.0},
    },
    "ppo_kl": {"name": "ppo", "kl": {"coef": 0.05, "estimator": "k1"}},
}


@pytest.mark.parametrize("fields", ALGORITHMS.values(), ids=ALGORITHMS.keys())
def test_each_algorithm_trains_a_tiny_transformer_through_make_train_step(fields):
    algorithm = build_algorithm(AlgorithmConfig.model_validate(fields), max_policy_tokens=8)
    model = Transformer(CONFIG, rngs=nnx.Rngs(0))
    if algorithm.needs_value_head:
        model = with_value_head(model, d_model=CONFIG.d_model, rngs=nnx.Rngs(1))
        assert isinstance(model, PolicyWithValue)
    optimizer = optax.adam(1e-2)
    graphdef, state = create_train_state(model, optimizer)
    reference = ReferencePolicy(graphdef, jax.tree.map(jnp.copy, state.params))
    train_step = make_train_step(graphdef, optimizer, algorithm.loss_fn)

    prepared = algorithm.prepare(_on_policy_groups(graphdef, state.params))
    assert prepared.stats["groups_dropped"] == (1 if algorithm.config.dynamic_sampling else 0)
    batch = algorithm.batch(
        prepared,
        batch_size=10,
        length_buckets=BUCKETS,
        pad_id=PAD_ID,
        reference=reference if algorithm.needs_reference else None,
    )
    assert set(batch.extras) == set(algorithm.extras_keys)

    losses = []
    for _ in range(6):
        state, metrics = train_step(state, batch)
        losses.append(float(metrics["loss"]))

    assert all(math.isfinite(loss) for loss in losses), losses
    assert losses[-1] < losses[0] - 1e-3, losses
    assert train_step.trace_count == 1
    assert all(jnp.ndim(value) == 0 for value in metrics.values())
    if algorithm.config.name != "sft":
        assert {"clip_fraction_low", "clip_fraction_high", "entropy", "policy_loss"} <= set(metrics)
    if algorithm.needs_reference:
        assert float(metrics["kl"]) != 0.0
    if algorithm.config.importance_sampling is not None:
        assert {"tis_ratio_mean", "tis_truncated_fraction"} <= set(metrics)
    if algorithm.needs_value_head:
        assert {"value_loss", "explained_variance"} <= set(metrics)
