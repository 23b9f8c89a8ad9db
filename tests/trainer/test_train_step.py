"""The jitted train step: it learns, it compiles once per bucket, and padding is inert."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from policy.lora import apply_lora
from policy.model import Transformer, TransformerConfig
from policy.tokenizer import BOS_ID, EOS_ID, PAD_ID, VOCAB_SIZE
from tandem.configs.parallelism import LoRAConfig
from trainer.losses import grpo_loss, sft_loss, token_logprobs
from trainer.train_batch import batch_tokens, pad_batch
from trainer.train_state import create_train_state, trainable_params
from trainer.train_step import make_train_step, on_token_statistics, train_updates

CONFIG = TransformerConfig(
    vocab_size=VOCAB_SIZE, d_model=32, num_layers=2, num_heads=2, mlp_dim=64, max_seq_len=64
)
BUCKETS = (16, 32)


def _optimizer(learning_rate: float = 1e-2) -> optax.GradientTransformation:
    return optax.chain(optax.clip_by_global_norm(1.0), optax.adam(learning_rate))


def _demonstrations() -> tuple[list[list[int]], list[list[int]]]:
    """Prompt bytes (masked out) followed by an answer and EOS (masked in)."""
    sequences, masks = [], []
    for prompt, answer in [(b"2+3=", b"5"), (b"hello", b" world"), (b"abc", b"def")]:
        tokens = [BOS_ID, *prompt, *answer, EOS_ID]
        sequences.append(tokens)
        masks.append([0] * (1 + len(prompt)) + [1] * (len(answer) + 1))
    return sequences, masks


def _sft_batch(sequences, masks, batch_size=4):
    return pad_batch(
        sequences,
        loss_masks=masks,
        behaviour_logprobs=None,
        advantages=None,
        batch_size=batch_size,
        length_buckets=BUCKETS,
        pad_id=PAD_ID,
    )


def test_pad_batch_right_pads_to_the_smallest_bucket_and_masks_extra_rows():
    batch = pad_batch(
        [[1, 2, 3], [4, 5]],
        loss_masks=[[0, 1, 1], [0, 1]],
        behaviour_logprobs=[[0.0, -0.5, -0.25], [0.0, -1.0]],
        advantages=[1.5, -0.5],
        batch_size=4,
        length_buckets=(8, 4),
        pad_id=PAD_ID,
    )
    assert batch.tokens.shape == (4, 4)
    np.testing.assert_array_equal(batch.tokens[0], [1, 2, 3, PAD_ID])
    np.testing.assert_array_equal(batch.tokens[3], [PAD_ID] * 4)
    np.testing.assert_array_equal(batch.attention_mask[1], [True, True, False, False])
    np.testing.assert_array_equal(batch.attention_mask[2:], False)
    np.testing.assert_array_equal(
        batch.loss_mask[:, :3], [[0, 1, 1], [0, 1, 0], [0, 0, 0], [0, 0, 0]]
    )
    np.testing.assert_array_equal(batch.positions[1], [0, 1, 2, 3])
    np.testing.assert_allclose(batch.behaviour_logprobs[0], [0.0, -0.5, -0.25, 0.0])
    np.testing.assert_allclose(batch.advantages, [1.5, -0.5, 0.0, 0.0])


def test_a_record_of_two_segments_trains_each_as_if_it_were_alone():
    """past_reasoning: drop packs a turn's own context after the previous one; neither sees the other."""
    model = Transformer(CONFIG, rngs=nnx.Rngs(0))
    first, second = [BOS_ID, *b"think then act", EOS_ID], [BOS_ID, *b"act", EOS_ID]
    packed = pad_batch([first + second], loss_masks=[[1] * (len(first) + len(second))],
                       segment_starts=[(0, len(first))], behaviour_logprobs=None, advantages=None,
                       batch_size=1, length_buckets=BUCKETS, pad_id=PAD_ID)
    np.testing.assert_array_equal(packed.attention_mask[0, : len(first) + len(second)],
                                  [1] * len(first) + [2] * len(second))
    np.testing.assert_array_equal(packed.positions[0, len(first): len(first) + len(second)], range(len(second)))
    alone = [_sft_batch([sequence], [[1] * len(sequence)], batch_size=1) for sequence in (first, second)]
    packed_logits = model(packed.tokens, packed.positions, packed.attention_mask)[0]
    for offset, (sequence, batch) in zip((0, len(first)), zip((first, second), alone, strict=True), strict=True):
        own = model(batch.tokens, batch.positions, batch.attention_mask)[0, : len(sequence)]
        np.testing.assert_allclose(packed_logits[offset: offset + len(sequence)], own, atol=1e-5)


def test_pad_batch_refuses_what_does_not_fit():
    _pad = functools.partial(
        pad_batch, behaviour_logprobs=None, advantages=None, length_buckets=(4,), pad_id=PAD_ID
    )
    with pytest.raises(ValueError, match="largest length bucket 4"):
        _pad([[1] * 5], loss_masks=[[1] * 5], batch_size=1)
    with pytest.raises(ValueError, match="batch_size=1"):
        _pad([[1], [2]], loss_masks=[[1], [1]], batch_size=1)
    with pytest.raises(ValueError, match="loss mask"):
        _pad([[1, 2]], loss_masks=[[1]], batch_size=1)


def test_sft_steps_on_a_fixed_batch_reduce_the_loss_without_touching_the_model():
    model = Transformer(CONFIG, rngs=nnx.Rngs(0))
    optimizer = _optimizer()
    graphdef, state = create_train_state(model, optimizer)
    train_step = make_train_step(graphdef, optimizer, on_token_statistics(sft_loss))
    batch = _sft_batch(*_demonstrations())

    losses = []
    for _ in range(15):
        state, metrics = train_step(state, batch)
        losses.append(float(metrics["loss"]))

    assert losses[-1] < 0.5 * losses[0], losses
    assert int(state.step) == 15
    assert set(metrics) >= {"loss", "grad_norm", "token_accuracy", "num_tokens"}
    assert float(metrics["num_tokens"]) == 2 + 7 + 4
    # Donating the state did not delete the arrays the model was built with.
    assert bool(jnp.all(jnp.isfinite(model.head.kernel[...])))


def _sft_step():
    """A fresh model's state and its SFT step."""
    optimizer = _optimizer()
    graphdef, state = create_train_state(Transformer(CONFIG, rngs=nnx.Rngs(1)), optimizer)
    return state, make_train_step(graphdef, optimizer, on_token_statistics(sft_loss))


def test_no_retrace_across_batches_of_the_same_bucket():
    state, train_step = _sft_step()
    sequences, masks = _demonstrations()

    state, _ = train_step(state, _sft_batch(sequences, masks))
    assert train_step.trace_count == 1
    # Fewer rows, other lengths, other contents: same (4, 16) bucket.
    state, _ = train_step(state, _sft_batch(sequences[:1], masks[:1]))
    state, _ = train_step(state, _sft_batch([[BOS_ID, 7] * 7], [[0, 1] * 7]))
    assert train_step.trace_count == 1

    state, _ = train_step(state, _sft_batch([[BOS_ID] * 20], [[1] * 20]))
    assert train_step.trace_count == 2


def test_the_step_gives_the_compilers_freed_memory_back_after_each_new_shape_only(monkeypatch):
    """glibc keeps what XLA's compiler freed (hundreds of MB for a real model's step), so the step's
    own arrays add to the resident size instead of reusing it; a trim per update would cost every step."""
    import trainer.train_step as train_step_module

    releases = []
    monkeypatch.setattr(train_step_module, "release_free_pages", lambda: releases.append(1))
    state, train_step = _sft_step()
    sequences, masks = _demonstrations()

    state, _ = train_step(state, _sft_batch(sequences, masks))
    state, _ = train_step(state, _sft_batch(sequences[:1], masks[:1]))  # the same bucket: compiled already
    assert len(releases) == 1
    state, _ = train_step(state, _sft_batch([[BOS_ID] * 20], [[1] * 20]))
    assert len(releases) == 2
    train_step.compiled(state, _sft_batch(sequences, masks, batch_size=8))  # more rows: another shape
    assert len(releases) == 3


def test_padding_rows_and_trailing_tool_tokens_do_not_change_the_gradient():
    """Only the loss-masked tokens and their context reach the update."""
    model = Transformer(CONFIG, rngs=nnx.Rngs(2))
    optimizer = optax.sgd(1.0)
    graphdef, state = create_train_state(model, optimizer)
    train_step = make_train_step(graphdef, optimizer, on_token_statistics(sft_loss))
    sequence = [BOS_ID, 10, 11, 12, 13]
    mask = [0, 0, 1, 1, 0]

    def updated_params(sequences, masks):
        start = jax.tree.map(jnp.copy, state)
        new_state, metrics = train_step(start, _sft_batch(sequences, masks))
        return new_state.params, float(metrics["loss"])

    reference, loss = updated_params([sequence], [mask])
    # A tool token after the last policy token is edited, and two padding rows are added.
    edited, edited_loss = updated_params(
        [sequence[:-1] + [99], [BOS_ID, 1, 2], [BOS_ID, 3]], [mask, [0, 0, 0], [0, 0]]
    )
    assert edited_loss == pytest.approx(loss, abs=1e-5)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), reference, edited)
    # Editing a policy token does change the loss.
    _, policy_edited_loss = updated_params([sequence[:3] + [99] + sequence[4:]], [mask])
    assert abs(policy_edited_loss - loss) > 1e-3


def test_a_grpo_step_raises_the_likelihood_of_a_positive_advantage_sequence():
    model = Transformer(CONFIG, rngs=nnx.Rngs(3))
    optimizer = _optimizer(3e-3)
    graphdef, state = create_train_state(model, optimizer)
    train_step = make_train_step(
        graphdef, optimizer, on_token_statistics(functools.partial(grpo_loss, clip_epsilon=0.2))
    )
    good, bad = [BOS_ID, 1, 2, 3, 4, 5], [BOS_ID, 1, 9, 9, 9, 9]
    mask = [0, 0, 1, 1, 1, 1]

    def sequence_logprobs(params, batch):
        logits = nnx.merge(graphdef, params)(batch.tokens, batch.positions, batch.attention_mask)
        per_token = token_logprobs(logits[:, :-1], batch.tokens[:, 1:])
        return jnp.sum(per_token * batch.loss_mask[:, 1:], axis=1)

    # On-policy data: behaviour log-probs are the current policy's (ratio 1).
    probe = _sft_batch([good, bad], [mask, mask])
    logits = nnx.merge(graphdef, state.params)(probe.tokens, probe.positions, probe.attention_mask)
    behaviour = np.zeros(probe.tokens.shape, np.float32)
    behaviour[:, 1:] = token_logprobs(logits[:, :-1], probe.tokens[:, 1:])
    batch = pad_batch(
        [good, bad],
        loss_masks=[mask, mask],
        behaviour_logprobs=[behaviour[0, : len(good)].tolist(), behaviour[1, : len(bad)].tolist()],
        advantages=[1.0, -1.0],
        batch_size=4,
        length_buckets=BUCKETS,
        pad_id=PAD_ID,
    )
    before = sequence_logprobs(state.params, batch)
    state, metrics = train_step(state, batch)
    after = sequence_logprobs(state.params, batch)

    np.testing.assert_allclose(metrics["ratio_mean"], 1.0, atol=1e-4)
    assert float(metrics["clip_fraction"]) == 0.0
    assert float(after[0]) > float(before[0])
    assert float(after[1]) < float(before[1])


def test_a_lora_step_trains_only_adapters_and_keeps_base_buffers_in_place():
    model = apply_lora(
        Transformer(CONFIG, rngs=nnx.Rngs(4)),
        LoRAConfig(enabled=True, rank=4, targets=["attention.query", "mlp.down"]),
        rngs=nnx.Rngs(5),
    )
    optimizer = _optimizer()
    graphdef, state = create_train_state(model, optimizer)
    train_step = make_train_step(graphdef, optimizer, on_token_statistics(sft_loss))
    batch = _sft_batch(*_demonstrations())
    adapters, base = trainable_params(state.params)
    base_before = jax.tree.map(np.array, base)
    adapters_before = jax.tree.map(np.array, adapters)
    base_buffers = [leaf.unsafe_buffer_pointer() for leaf in jax.tree.leaves(base)]
    # Adam moments exist for the 2 x 2 x 2 adapter matrices only (plus the step count).
    assert len(jax.tree.leaves(state.opt_state)) == 2 * 8 + 1

    losses = []
    for _ in range(5):
        state, metrics = train_step(state, batch)
        losses.append(float(metrics["loss"]))

    assert losses[-1] < losses[0]
    adapters, base = trainable_params(state.params)
    jax.tree.map(np.testing.assert_array_equal, base, base_before)
    # Donated and returned untouched, so XLA aliased them: the very same buffers.
    assert [leaf.unsafe_buffer_pointer() for leaf in jax.tree.leaves(base)] == base_buffers
    for after, before in zip(jax.tree.leaves(adapters), jax.tree.leaves(adapters_before), strict=True):
        assert not np.array_equal(np.asarray(after), before)
    assert train_step.trace_count == 1


def test_several_updates_on_one_batch_move_the_ratio_off_one_and_match_single_steps():
    """GRPO's mu > 1: the first update is on-policy (ratio 1), later ones see the moved policy."""
    model = Transformer(CONFIG, rngs=nnx.Rngs(5))
    optimizer = _optimizer(3e-2)
    graphdef, state = create_train_state(model, optimizer)
    train_step = make_train_step(
        graphdef, optimizer, on_token_statistics(functools.partial(grpo_loss, clip_epsilon=0.2))
    )
    sequence, mask = [BOS_ID, 1, 2, 3, 4, 5], [0, 0, 1, 1, 1, 1]
    probe = _sft_batch([sequence], [mask])
    logits = nnx.merge(graphdef, state.params)(probe.tokens, probe.positions, probe.attention_mask)
    behaviour = np.zeros(probe.tokens.shape, np.float32)
    behaviour[:, 1:] = token_logprobs(logits[:, :-1], probe.tokens[:, 1:])
    batch = pad_batch([sequence], loss_masks=[mask], behaviour_logprobs=[behaviour[0, : len(sequence)].tolist()],
                      advantages=[1.0], batch_size=4, length_buckets=BUCKETS, pad_id=PAD_ID)

    stepped = jax.tree.map(jnp.copy, state)  # the step donates its input state
    single = []
    for _ in range(3):
        stepped, metrics = train_step(stepped, batch)
        single.append(float(metrics["ratio_mean"]))
    updated, per_update = train_updates(train_step, state, batch, updates=3)

    assert [round(m["ratio_mean"], 6) for m in per_update] == [round(r, 6) for r in single]
    np.testing.assert_allclose(per_update[0]["ratio_mean"], 1.0, atol=1e-4)
    assert per_update[2]["ratio_mean"] > per_update[1]["ratio_mean"] > 1.0  # the advantage is positive
    assert int(updated.step) == 3
    for got, want in zip(jax.tree_util.tree_leaves(updated.params), jax.tree_util.tree_leaves(stepped.params),
                         strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert train_step.trace_count == 1
    with pytest.raises(ValueError, match="updates must be at least 1"):
        train_updates(train_step, state, batch, updates=0)


def test_batch_tokens_counts_the_attended_tokens_of_real_rows_only():
    sequences, masks = _demonstrations()
    batch = _sft_batch(sequences, masks, batch_size=4)  # three real rows, one padding row

    assert batch_tokens(batch) == sum(len(sequence) for sequence in sequences)
