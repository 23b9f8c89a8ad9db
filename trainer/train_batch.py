"""The trainer's batch: padded sequences and what every loss reads of them, built by :func:`pad_batch`.

Batches are right-padded to a few length buckets and a fixed row count, so that after one
compilation per bucket the train step never recompiles.
"""

from __future__ import annotations

import bisect

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np


@flax.struct.dataclass
class TrainBatch:
    """A padded batch of sequences, the input of every loss.

    Padding is on the right: row ``b`` holds its tokens at slots ``0 ..
    n_b - 1`` with positions ``0 .. n_b - 1``.
    """

    # int32 [B, T] token ids; pad_id after each sequence.
    tokens: jax.Array
    # int32 [B, T] rotary positions.
    positions: jax.Array
    # int32 [B, T] segment ids: 1 on a sequence's tokens (2, 3... on later segments of a
    # record with several contexts), 0 on padding. Tokens attend only within their segment.
    attention_mask: jax.Array
    # float32 [B, T], 1 on tokens the policy generated (the only ones trained on).
    loss_mask: jax.Array
    # float32 [B] per-sequence advantage (RL); zeros for SFT.
    advantages: jax.Array
    # float32 [B, T] log-prob of each token under the policy that sampled it (RL); zeros for SFT.
    behaviour_logprobs: jax.Array
    # Algorithm-specific arrays, e.g. reference log-probs [B, T] for a KL penalty or
    # returns and old values for PPO. Keys are fixed per algorithm, so shapes stay static.
    extras: dict[str, jax.Array] = flax.struct.field(default_factory=dict)


def pad_batch(
    sequences: list[list[int]],
    *,
    loss_masks: list[list[int]],
    segment_starts: list[tuple[int, ...]] | None = None,
    behaviour_logprobs: list[list[float]] | None,
    advantages: list[float] | None,
    batch_size: int,
    length_buckets: tuple[int, ...],
    pad_id: int,
) -> TrainBatch:
    """Right-pad sequences to the smallest length bucket that fits, and to ``batch_size`` rows.

    Extra rows are fully masked (no attention, loss mask 0, advantage 0), so
    a partial batch trains exactly like the same sequences alone. Missing
    ``behaviour_logprobs`` or ``advantages`` (SFT) become zeros. A sequence with
    ``segment_starts`` beyond 0 holds several contexts: each gets its own segment
    id and positions from 0, so it trains as if alone.

    Raises:
      ValueError: more sequences than ``batch_size``, a sequence longer than
        the largest bucket, or per-token lists whose lengths do not match.
    """
    if len(sequences) > batch_size:
        raise ValueError(f"{len(sequences)} sequences do not fit batch_size={batch_size}")
    if len(loss_masks) != len(sequences):
        raise ValueError(f"{len(loss_masks)} loss masks for {len(sequences)} sequences")
    if behaviour_logprobs is not None and len(behaviour_logprobs) != len(sequences):
        raise ValueError(
            f"{len(behaviour_logprobs)} behaviour log-prob lists for {len(sequences)} sequences"
        )
    if advantages is not None and len(advantages) != len(sequences):
        raise ValueError(f"{len(advantages)} advantages for {len(sequences)} sequences")
    buckets = sorted(length_buckets)
    longest = max((len(sequence) for sequence in sequences), default=0)
    if longest > buckets[-1]:
        raise ValueError(
            f"a sequence of {longest} tokens exceeds the largest length bucket {buckets[-1]}"
        )
    length = buckets[bisect.bisect_left(buckets, longest)]

    tokens = np.full((batch_size, length), pad_id, np.int32)
    attention_mask = np.zeros((batch_size, length), np.int32)
    positions = np.tile(np.arange(length, dtype=np.int32), (batch_size, 1))
    loss_mask = np.zeros((batch_size, length), np.float32)
    behaviour = np.zeros((batch_size, length), np.float32)
    advantage = np.zeros((batch_size,), np.float32)
    for row, sequence in enumerate(sequences):
        size = len(sequence)
        if len(loss_masks[row]) != size:
            raise ValueError(
                f"sequence {row} has {size} tokens but its loss mask has {len(loss_masks[row])}"
            )
        tokens[row, :size] = sequence
        starts = [start for start in (segment_starts[row] if segment_starts else (0,)) if start < size] or [0]
        for segment, (begin, end) in enumerate(zip(starts, [*starts[1:], size], strict=True), start=1):
            attention_mask[row, begin:end] = segment
            positions[row, begin:end] = np.arange(end - begin, dtype=np.int32)
        loss_mask[row, :size] = loss_masks[row]
        if behaviour_logprobs is not None:
            if len(behaviour_logprobs[row]) != size:
                raise ValueError(
                    f"sequence {row} has {size} tokens but {len(behaviour_logprobs[row])} "
                    "behaviour log-probs"
                )
            behaviour[row, :size] = behaviour_logprobs[row]
        if advantages is not None:
            advantage[row] = advantages[row]
    return TrainBatch(
        tokens=jnp.asarray(tokens),
        positions=jnp.asarray(positions),
        attention_mask=jnp.asarray(attention_mask),
        loss_mask=jnp.asarray(loss_mask),
        advantages=jnp.asarray(advantage),
        behaviour_logprobs=jnp.asarray(behaviour),
    )


def batch_tokens(batch: TrainBatch) -> int:
    """Tokens the batch trains on (its attention mask), counted on the host.

    ``batch.attention_mask.sum()`` would dispatch a device reduction and wait
    for it: about 0.4 ms a step on CPU, most of the profiling's whole cost.
    The mask already sits where the host can read it (or is a few kB away).
    """
    return int(np.count_nonzero(np.asarray(batch.attention_mask)))
