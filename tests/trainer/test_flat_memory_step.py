"""The trainer's step without full logits and in micro-batches computes what the plain step computes.

Two claims, each checked for SFT, every GRPO-family variant, PPO with its value head, and LoRA:

- the token statistics taken from hidden states in chunks (trainer/token_statistics.py) give the
  loss and gradients of today's step, which takes a float32 log-softmax over the whole [B, T, V];
- a step run as micro-batches (``micro_batch_tokens``) equals the same step in one batch: every
  loss aggregation divides by the whole step's tokens and episodes, gradients accumulate once.

Updates are plain SGD with a learning rate of 1, so the parameters after one step differ from those
before by exactly the gradient, and comparing them compares the gradients.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from policy.lora import apply_lora
from policy.model import Transformer, TransformerConfig, preset
from tandem.configs.algorithm import AlgorithmConfig
from tandem.configs.memory import micro_batch_rows
from tandem.configs.parallelism import LoRAConfig
from trainer import algorithms
from trainer.algorithms import ReferencePolicy, build_algorithm
from trainer.token_statistics import chunked_token_statistics, logits_token_statistics
from trainer.train_batch import batch_tokens, pack_batch
from trainer.train_state import create_train_state
from trainer.train_step import computed_slots, make_train_step, split_micro_batches
from trainer.value_head import with_value_head

from .test_algorithms import ALGORITHMS, BUCKETS, CONFIG, PAD_ID, _on_policy_groups

TOLERANCE = 1e-5
CASES = {**ALGORITHMS, "grpo_lora": {"name": "grpo", "kl": {"coef": 0.05, "estimator": "k3"}},
         "dr_grpo_kl": {"name": "dr_grpo", "kl": {"coef": 0.1, "estimator": "k3"}}}
# 10 rows of 16 tokens: 3 rows a micro-batch, so 4 micro-batches, the last one padded with empty rows.
ROWS, MICRO_BATCH_TOKENS = 10, 3 * BUCKETS[0]


# Gemma 3's layout at toy size: a sliding layer with a window of 5 and its own rotary base, then a
# full one; norms after the sublayers, GeGLU, QK-norm, scaled and tied embeddings.
GEMMA3_SHAPED = dataclasses.replace(
    CONFIG, num_layers=2, layer_attention=("sliding", "full"), sliding_window=5, sliding_rope_theta=100.0,
    qk_norm=True, post_sublayer_norms=True, scale_embeddings=True, mlp_activation="gelu_tanh",
    tie_embeddings=True, query_pre_attention_scalar=8)


def _algorithm_batch(case: str, *, logits_chunk_tokens: int = 8, config: TransformerConfig = CONFIG,
                     pack: bool = False, pack_row_tokens: int | None = None,
                     attention_query_chunk: int | None = None):
    """The case's algorithm, a model's graphdef and state (SGD), and a step's batch with every extra
    (with ``pack``, its episodes packed several to a row, of ``pack_row_tokens`` where given)."""
    algorithm = build_algorithm(AlgorithmConfig.model_validate(CASES[case]), max_policy_tokens=8,
                                temperature=0.8, logits_chunk_tokens=logits_chunk_tokens,
                                attention_query_chunk=attention_query_chunk)
    model = Transformer(config, rngs=nnx.Rngs(0))
    if case.endswith("lora"):
        model = apply_lora(model, LoRAConfig(enabled=True, rank=2, targets=["attention.query", "mlp.up"]),
                           rngs=nnx.Rngs(5))
    if algorithm.needs_value_head:
        model = with_value_head(model, d_model=config.d_model, rngs=nnx.Rngs(1))
    optimizer = optax.sgd(1.0)
    graphdef, state = create_train_state(model, optimizer)
    # A reference a little away from the policy, so that the KL term and its gradient are not zero.
    reference_params = jax.tree.map(lambda leaf: leaf * 1.05 if jnp.issubdtype(leaf.dtype, jnp.floating) else leaf,
                                    state.params)
    prepared = algorithm.prepare(_on_policy_groups(graphdef, state.params))
    batch = algorithm.batch(prepared, batch_size=ROWS, length_buckets=BUCKETS, pad_id=PAD_ID,
                            reference=ReferencePolicy(graphdef, reference_params) if algorithm.needs_reference
                            else None, pack_row_multiple=1 if pack else None, pack_row_tokens=pack_row_tokens)
    return algorithm, graphdef, state, optimizer, batch


def _full_logits_statistics(model, batch, *, temperature=1.0, chunk_tokens, remat="none", query_chunk=None):
    """The statistics today's step took: from the whole [B, T, V] logits (in place of policy_token_statistics)."""
    hidden = model.hidden_states(batch.tokens, batch.positions, batch.attention_mask, remat=remat,
                                 query_chunk=query_chunk)
    return logits_token_statistics(model.logits(hidden), batch.tokens, temperature=temperature), hidden


def _one_step(graphdef, state, optimizer, loss_fn, batch, *, micro_batch_tokens=None):
    step = make_train_step(graphdef, optimizer, loss_fn, micro_batch_tokens=micro_batch_tokens)
    state, metrics = step(jax.tree.map(jnp.copy, state), batch)
    return jax.device_get(state.params), {name: float(value) for name, value in jax.device_get(metrics).items()}


def _assert_same_step(expected, actual):
    (expected_params, expected_metrics), (actual_params, actual_metrics) = expected, actual
    assert set(actual_metrics) == set(expected_metrics)
    for name, value in expected_metrics.items():
        np.testing.assert_allclose(actual_metrics[name], value, atol=TOLERANCE, rtol=TOLERANCE, err_msg=name)
    for (path, leaf), other in zip(jax.tree_util.tree_leaves_with_path(expected_params),
                                   jax.tree_util.tree_leaves(actual_params), strict=True):
        np.testing.assert_allclose(other, leaf, atol=TOLERANCE, rtol=TOLERANCE, err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("chunk_positions", [1, 4, 5, 64])
def test_chunked_statistics_and_their_gradients_equal_those_of_the_full_logits(tied, chunk_positions):
    config = TransformerConfig(vocab_size=40, d_model=16, num_layers=1, num_heads=2, mlp_dim=32, max_seq_len=32,
                               tie_embeddings=tied)
    graphdef, params = nnx.split(Transformer(config, rngs=nnx.Rngs(2)))
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, 40, (3, 13)), jnp.int32)
    positions = jnp.tile(jnp.arange(13, dtype=jnp.int32), (3, 1))
    segments = jnp.ones((3, 13), jnp.int32)
    weights = jnp.asarray(rng.normal(size=(3, 12)), jnp.float32)

    def statistics(params, chunked: bool):
        model = nnx.merge(graphdef, params)
        hidden = model.hidden_states(tokens, positions, segments)
        if chunked:
            return chunked_token_statistics(hidden, model.logits, tokens, temperature=0.7,
                                            chunk_positions=chunk_positions)
        return logits_token_statistics(model.logits(hidden), tokens, temperature=0.7)

    full, chunked = statistics(params, False), statistics(params, True)
    for name in ("logprobs", "entropy", "argmax_hits"):
        np.testing.assert_allclose(getattr(chunked, name), getattr(full, name), atol=TOLERANCE, err_msg=name)
    assert float(jnp.sum(full.argmax_hits)) >= 0 and full.logprobs.shape == (3, 12)

    def objective(params, chunked):
        return jnp.sum(statistics(params, chunked).logprobs * weights)

    full_grads = jax.grad(objective)(params, False)
    chunked_grads = jax.grad(objective)(params, True)
    assert any(float(jnp.max(jnp.abs(leaf))) > 0 for leaf in jax.tree.leaves(full_grads))
    for expected, actual in zip(jax.tree.leaves(full_grads), jax.tree.leaves(chunked_grads), strict=True):
        np.testing.assert_allclose(actual, expected, atol=TOLERANCE)


@pytest.mark.parametrize("case", CASES)
def test_the_chunked_step_gives_the_loss_and_gradients_of_the_full_logits_step(case, monkeypatch):
    algorithm, graphdef, state, optimizer, batch = _algorithm_batch(case, logits_chunk_tokens=8)
    chunked = _one_step(graphdef, state, optimizer, algorithm.loss_fn, batch)

    # Today's step: the algorithm's losses read statistics of the whole [B, T, V] logits.
    monkeypatch.setattr(algorithms, "policy_token_statistics", _full_logits_statistics)
    full = _one_step(graphdef, state, optimizer, algorithm.loss_fn, batch)

    _assert_same_step(full, chunked)
    assert full[1]["grad_norm"] > 0 and full[1]["num_tokens"] > 0


@pytest.mark.parametrize("case", CASES)
def test_a_step_in_micro_batches_equals_the_step_in_one_batch(case):
    algorithm, graphdef, state, optimizer, batch = _algorithm_batch(case)
    # A budget of 3 rows: 10 rows go as 5 micro-batches of 2, where 4 of 3 would compute 2 empty rows.
    assert micro_batch_rows(ROWS, BUCKETS[0], MICRO_BATCH_TOKENS) == 2
    assert split_micro_batches(batch, 3).tokens.shape == (4, 3, BUCKETS[0])

    whole = _one_step(graphdef, state, optimizer, algorithm.loss_fn, batch)
    in_micro_batches = _one_step(graphdef, state, optimizer, algorithm.loss_fn, batch,
                                 micro_batch_tokens=MICRO_BATCH_TOKENS)

    _assert_same_step(whole, in_micro_batches)
    assert computed_slots(batch, MICRO_BATCH_TOKENS) == ROWS * BUCKETS[0]
    assert computed_slots(batch, None) == ROWS * BUCKETS[0]

    # 7 rows under a budget of 4 can only go with an empty row: 2 micro-batches of 4, the last one
    # filled with an empty row, which changes nothing and which padding counts.
    seven = jax.tree.map(lambda rows: rows[:7], batch)
    assert micro_batch_rows(7, BUCKETS[0], 4 * BUCKETS[0]) == 4
    _assert_same_step(_one_step(graphdef, state, optimizer, algorithm.loss_fn, seven),
                      _one_step(graphdef, state, optimizer, algorithm.loss_fn, seven,
                                micro_batch_tokens=4 * BUCKETS[0]))
    assert computed_slots(seven, 4 * BUCKETS[0]) == 8 * BUCKETS[0]
    assert whole[1]["grad_norm"] > 0
    if algorithm.needs_reference:
        assert whole[1]["kl"] != 0.0
    if algorithm.config.importance_sampling is not None:
        assert whole[1]["tis_ratio_max"] >= whole[1]["tis_ratio_min"] > 0


@pytest.mark.parametrize("pack", [False, True])
def test_the_reference_log_probs_in_micro_batches_equal_them_in_one_batch(pack):
    """The KL penalty's reference pass runs in the step's micro-batches (its activations stay those of one
    micro-batch), and gives what one pass over the whole batch gives."""
    algorithm, graphdef, state, _, batch = _algorithm_batch("dr_grpo_kl", pack=pack)
    reference = ReferencePolicy(graphdef, state.params)
    whole = reference.logprobs(batch, temperature=0.8, logits_chunk_tokens=8)
    rows, length = batch.tokens.shape
    micro_batch_tokens = 2 * length if pack else MICRO_BATCH_TOKENS
    assert micro_batch_rows(rows, length, micro_batch_tokens) < rows
    in_micro_batches = reference.logprobs(batch, temperature=0.8, logits_chunk_tokens=8,
                                          micro_batch_tokens=micro_batch_tokens)
    assert in_micro_batches.shape == whole.shape == (rows, length)
    np.testing.assert_allclose(np.asarray(in_micro_batches), np.asarray(whole), atol=TOLERANCE, rtol=0)
    assert float(jnp.sum(jnp.abs(whole))) > 0

    def temporaries(budget):
        compiled = algorithms.reference_logprobs.lower(graphdef, state.params, batch, temperature=0.8,
                                                       logits_chunk_tokens=8, micro_batch_tokens=budget).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    assert temporaries(micro_batch_tokens) < temporaries(None)


@pytest.mark.parametrize("case", ["grpo_lora", "ppo_kl"])
def test_a_gemma3_shaped_policy_steps_alike_in_chunks_and_micro_batches(case, monkeypatch):
    algorithm, graphdef, state, optimizer, batch = _algorithm_batch(case, config=GEMMA3_SHAPED)
    in_micro_batches = _one_step(graphdef, state, optimizer, algorithm.loss_fn, batch,
                                 micro_batch_tokens=MICRO_BATCH_TOKENS)

    monkeypatch.setattr(algorithms, "policy_token_statistics", _full_logits_statistics)
    whole_with_full_logits = _one_step(graphdef, state, optimizer, algorithm.loss_fn, batch)

    _assert_same_step(whole_with_full_logits, in_micro_batches)
    assert whole_with_full_logits[1]["grad_norm"] > 0


def test_the_sft_phase_in_micro_batches_equals_it_in_one_batch():
    algorithm, graphdef, state, optimizer, batch = _algorithm_batch("grpo")

    whole = _one_step(graphdef, state, optimizer, algorithm.sft_loss_fn, batch)
    in_micro_batches = _one_step(graphdef, state, optimizer, algorithm.sft_loss_fn, batch, micro_batch_tokens=20)

    _assert_same_step(whole, in_micro_batches)
    assert 0 <= whole[1]["token_accuracy"] <= 1


@pytest.mark.parametrize("remat", ["full", "save_matmuls"])
def test_remat_recomputes_the_blocks_and_changes_nothing_in_the_step(remat):
    config = AlgorithmConfig.model_validate(CASES["grpo_kl_token_tis"])
    _, graphdef, state, optimizer, batch = _algorithm_batch("grpo_kl_token_tis")
    plain = build_algorithm(config, max_policy_tokens=8, temperature=0.8, logits_chunk_tokens=8)
    rematerialised = build_algorithm(config, max_policy_tokens=8, temperature=0.8, logits_chunk_tokens=8,
                                     remat=remat)

    def hidden_sum(params, remat):
        model = nnx.merge(graphdef, params)
        return jnp.sum(model.hidden_states(batch.tokens, batch.positions, batch.attention_mask, remat=remat))

    # The backward pass of a rematerialised block holds a remat of its forward; the plain one none.
    assert "remat" in str(jax.make_jaxpr(jax.grad(hidden_sum), static_argnums=1)(state.params, remat))
    assert "remat" not in str(jax.make_jaxpr(jax.grad(hidden_sum), static_argnums=1)(state.params, "none"))
    _assert_same_step(_one_step(graphdef, state, optimizer, plain.loss_fn, batch),
                      _one_step(graphdef, state, optimizer, rematerialised.loss_fn, batch))


def test_remat_bounds_what_the_compiled_backward_pass_holds():
    # What XLA plans to hold at once for a gradient through the blocks, on the backend the tests run
    # on: a checkpointed block must keep only its input (full) or its matmuls (save_matmuls), as on
    # an accelerator. XLA's CPU backend once merged the recomputation back into the forward pass, so
    # every policy held as much as none.
    config = preset("small")
    graphdef, params = nnx.split(Transformer(config, rngs=nnx.Rngs(0)))
    tokens = jnp.zeros((2, 256), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(256), tokens.shape)
    mask = jnp.ones(tokens.shape, bool)

    def temporaries(remat: str) -> int:
        def loss(params):
            hidden = nnx.merge(graphdef, params).hidden_states(tokens, positions, mask, remat=remat)
            return jnp.sum(hidden**2)

        return jax.jit(jax.grad(loss)).lower(params).compile().memory_analysis().temp_size_in_bytes

    held = {remat: temporaries(remat) for remat in ("none", "save_matmuls", "full")}
    assert held["full"] < held["save_matmuls"] < held["none"] / 2, held
    assert held["full"] < held["none"] / 4, held


@pytest.mark.parametrize("case", CASES)
def test_a_packed_batch_gives_the_loss_and_gradients_of_the_unpacked_one(case):
    algorithm, graphdef, state, optimizer, batch = _algorithm_batch(case)
    *_, packed = _algorithm_batch(case, pack=True)
    # The same tokens in fewer rows, some of which hold two episodes.
    assert batch_tokens(packed) == batch_tokens(batch)
    assert packed.tokens.shape[0] < ROWS and int(jnp.max(packed.episodes)) == 2
    assert set(packed.extras) == set(batch.extras)

    unpacked = _one_step(graphdef, state, optimizer, algorithm.loss_fn, batch)
    _assert_same_step(unpacked, _one_step(graphdef, state, optimizer, algorithm.loss_fn, packed))
    # And packed rows in micro-batches of two rows.
    _assert_same_step(unpacked, _one_step(graphdef, state, optimizer, algorithm.loss_fn, packed,
                                          micro_batch_tokens=2 * BUCKETS[0]))
    assert unpacked[1]["grad_norm"] > 0


def test_packing_keeps_each_episode_as_it_is_alone():
    # Three episodes in rows of 8, longest first: the 5-token one, then the 4-token one (two contexts,
    # segments of 3 and 1) in a row of its own, then the 3-token one in the first row's room.
    sequences = [[5, 6, 7], [1, 2, 3, 4, 9], [8, 8, 8, 8]]
    packed = pack_batch(sequences, loss_masks=[[1, 1, 1], [0, 1, 1, 1, 1], [0, 1, 0, 1]],
                        segment_starts=[(0,), (0,), (0, 3)],
                        behaviour_logprobs=[[-5.0, -1, -2], [0.0] * 5, [0.0, -3, 0.0, -4]],
                        advantages=[0.5, -1.0, 2.0], length_buckets=(8,), pad_id=0, row_multiple=4,
                        token_extras={"token_rewards": [[0, 0, 1], [0, 0, 0, 0, 2], [0, 0, 0, 3]]})

    assert packed.tokens.shape == (4, 8)  # 2 rows of episodes, rounded up to a multiple of 4
    np.testing.assert_array_equal(packed.tokens[:2], [[1, 2, 3, 4, 9, 5, 6, 7], [8, 8, 8, 8, 0, 0, 0, 0]])
    np.testing.assert_array_equal(packed.attention_mask[:2], [[1, 1, 1, 1, 1, 2, 2, 2], [1, 1, 1, 2, 0, 0, 0, 0]])
    np.testing.assert_array_equal(packed.positions[:2, :5], [[0, 1, 2, 3, 4], [0, 1, 2, 0, 4]])
    np.testing.assert_array_equal(packed.positions[0, 5:], [0, 1, 2])
    np.testing.assert_array_equal(packed.episodes[:2], [[1, 1, 1, 1, 1, 2, 2, 2], [1, 1, 1, 1, 0, 0, 0, 0]])
    np.testing.assert_array_equal(packed.advantages, [[-1.0, 0.5], [2.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    # The second episode's first token is predicted from the first's last: never trained on.
    np.testing.assert_array_equal(packed.loss_mask[:2], [[0, 1, 1, 1, 1, 0, 1, 1], [0, 1, 0, 1, 0, 0, 0, 0]])
    np.testing.assert_array_equal(packed.behaviour_logprobs[:2, :8], [[0, 0, 0, 0, 0, -5, -1, -2],
                                                                      [0, -3, 0, -4, 0, 0, 0, 0]])
    np.testing.assert_array_equal(packed.extras["token_rewards"][:2], [[0, 0, 0, 0, 2, 0, 0, 1],
                                                                       [0, 0, 0, 3, 0, 0, 0, 0]])
    assert not packed.attention_mask[2:].any() and not packed.loss_mask[2:].any()
    with pytest.raises(ValueError, match="sequence 1 has 5 tokens but its loss mask has 4"):
        pack_batch(sequences, loss_masks=[[0, 1, 1], [0, 1, 1, 1], [0, 1, 0, 1]], behaviour_logprobs=None,
                   advantages=None, length_buckets=(8,), pad_id=0)


def test_rows_of_a_set_length_pack_tighter_and_give_the_same_step():
    # Episodes of 5, 4 and 3 tokens: rows of their bucket (8) hold them in 2 rows with 4 slots of
    # padding; rows of 12 (memory.pack_row_tokens) hold all three in one, with none.
    sequences = [[5, 6, 7], [1, 2, 3, 4, 9], [8, 8, 8, 8]]
    common = {"loss_masks": [[0, 1, 1], [0, 1, 1, 1, 1], [0, 1, 0, 1]], "behaviour_logprobs": None,
              "advantages": [0.5, -1.0, 2.0], "length_buckets": (8,), "pad_id": 0}
    in_buckets = pack_batch(sequences, **common)
    in_longer_rows = pack_batch(sequences, **common, row_tokens=12)
    assert in_buckets.tokens.shape == (2, 8) and in_longer_rows.tokens.shape == (1, 12)
    np.testing.assert_array_equal(in_longer_rows.episodes, [[1] * 5 + [2] * 4 + [3] * 3])
    np.testing.assert_array_equal(in_longer_rows.positions, [[0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 1, 2]])
    # A row length shorter than the longest episode's bucket gives way to the bucket.
    assert pack_batch(sequences, **common, row_tokens=4).tokens.shape == (2, 8)


@pytest.mark.parametrize("case", ["grpo_kl_token_tis", "ppo_kl", "dr_grpo_kl"])
def test_a_batch_packed_into_longer_rows_gives_the_loss_and_gradients_of_the_unpacked_one(case):
    algorithm, graphdef, state, optimizer, batch = _algorithm_batch(case)
    *_, packed = _algorithm_batch(case, pack=True, pack_row_tokens=3 * BUCKETS[0])
    assert packed.tokens.shape[1] == 3 * BUCKETS[0] and int(jnp.max(packed.episodes)) > 2
    assert batch_tokens(packed) == batch_tokens(batch)

    unpacked = _one_step(graphdef, state, optimizer, algorithm.loss_fn, batch)
    _assert_same_step(unpacked, _one_step(graphdef, state, optimizer, algorithm.loss_fn, packed))
    assert unpacked[1]["grad_norm"] > 0


def test_a_padding_target_packs_into_the_shortest_rows_that_meet_it():
    # Episodes of 200, 200, 150 and 150 tokens: no two share a row of their bucket (256), so 4 rows
    # compute 1,024 slots for 700 tokens; rows of 384 hold 200 + 150 twice, 768 slots.
    sequences = [[1] * 200, [2] * 200, [3] * 150, [4] * 150]
    common = {"loss_masks": [[1] * len(sequence) for sequence in sequences], "behaviour_logprobs": None,
              "advantages": [0.0] * 4, "length_buckets": (256,), "pad_id": 0, "micro_batch_tokens": 768}

    def padding(batch):
        return 1.0 - batch_tokens(batch) / computed_slots(batch, 768)

    assert pack_batch(sequences, **common).tokens.shape == (4, 256)
    assert padding(pack_batch(sequences, **common)) == pytest.approx(1 - 700 / 1024)
    met = pack_batch(sequences, **common, padding_target=0.1)
    assert met.tokens.shape == (2, 384) and padding(met) == pytest.approx(1 - 700 / 768)
    # A target no row length meets takes the least padded: the same rows of 384.
    assert pack_batch(sequences, **common, padding_target=0.01).tokens.shape == (2, 384)
    # A target the bucket's rows meet already keeps them.
    assert pack_batch(sequences, **common, padding_target=0.5).tokens.shape == (4, 256)


@pytest.mark.parametrize("case", ["grpo_kl_token_tis", "ppo_kl", "grpo_lora"])
def test_attention_a_chunk_of_queries_at_a_time_gives_the_step_of_whole_rows(case):
    # Rows of 48 packed tokens attend 16 queries at a time: three chunks, each over the keys before its end.
    algorithm, graphdef, state, optimizer, batch = _algorithm_batch(case, pack=True, pack_row_tokens=3 * BUCKETS[0])
    chunked, *_ = _algorithm_batch(case, attention_query_chunk=BUCKETS[0])
    assert batch.tokens.shape[1] == 3 * BUCKETS[0]

    whole = _one_step(graphdef, state, optimizer, algorithm.loss_fn, batch)
    _assert_same_step(whole, _one_step(graphdef, state, optimizer, chunked.loss_fn, batch))
    assert whole[1]["grad_norm"] > 0
