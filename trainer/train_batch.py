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

from tandem.configs.memory import computed_slots_of, packed_row_lengths


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
    # float32 [B] per-sequence advantage (RL); zeros for SFT. Packed: [B, K], the advantage of each
    # of a row's episodes, in the order they sit in it.
    advantages: jax.Array
    # float32 [B, T] log-prob of each token under the policy that sampled it (RL); zeros for SFT.
    behaviour_logprobs: jax.Array
    # Algorithm-specific arrays, e.g. reference log-probs [B, T] for a KL penalty or
    # returns and old values for PPO. Keys are fixed per algorithm, so shapes stay static.
    extras: dict[str, jax.Array] = flax.struct.field(default_factory=dict)
    # Packed rows only (:func:`pack_batch`): int32 [B, T], which of its row's episodes a token belongs
    # to, 1 .. K, 0 on padding. None: each row is one episode.
    episodes: jax.Array | None = None


def _length_bucket(sequences: list[list[int]], length_buckets: tuple[int, ...]) -> int:
    """The smallest of ``length_buckets`` that holds the longest sequence."""
    buckets = sorted(length_buckets)
    longest = max((len(sequence) for sequence in sequences), default=0)
    if longest > buckets[-1]:
        raise ValueError(f"a sequence of {longest} tokens exceeds the largest length bucket {buckets[-1]}")
    return buckets[bisect.bisect_left(buckets, longest)]


def _check_lengths(sequences: list[list[int]], *, loss_masks: list[list[int]],
                   behaviour_logprobs: list[list[float]] | None, advantages: list[float] | None,
                   token_extras: dict[str, list[list[float]]]) -> None:
    """Every per-sequence list has one entry per sequence, and every per-token one a value per token."""
    per_token_lists = {"loss mask": loss_masks, "behaviour log-prob list": behaviour_logprobs,
                       **{f"{key} list": values for key, values in token_extras.items()}}
    for name, per_token in per_token_lists.items():
        if per_token is None:
            continue
        if len(per_token) != len(sequences):
            raise ValueError(f"{len(per_token)} {name}s for {len(sequences)} sequences")
        for index, values in enumerate(per_token):
            if len(values) != len(sequences[index]):
                raise ValueError(f"sequence {index} has {len(sequences[index])} tokens but its {name} has "
                                 f"{len(values)}")
    if advantages is not None and len(advantages) != len(sequences):
        raise ValueError(f"{len(advantages)} advantages for {len(sequences)} sequences")


def _laid_out(sequences: list[list[int]], rows: list[list[int]], *, row_count: int, length: int,
              episode_slots: int, loss_masks: list[list[int]], segment_starts: list[tuple[int, ...]] | None,
              behaviour_logprobs: list[list[float]] | None, advantages: list[float] | None,
              token_extras: dict[str, list[list[float]]], pad_id: int) -> TrainBatch:
    """``sequences`` at their places: ``rows[r]`` lists the sequences of row ``r``, in order from its
    start. Every segment of a sequence gets an id of its own in its row and positions from 0; a row's
    sequences are its episodes 1, 2, ...; the rows past ``rows`` up to ``row_count`` are padding."""
    tokens = np.full((row_count, length), pad_id, np.int32)
    attention_mask = np.zeros((row_count, length), np.int32)
    positions = np.tile(np.arange(length, dtype=np.int32), (row_count, 1))
    loss_mask = np.zeros((row_count, length), np.float32)
    behaviour = np.zeros((row_count, length), np.float32)
    episodes = np.zeros((row_count, length), np.int32)
    advantage = np.zeros((row_count, episode_slots), np.float32)
    extras = {key: np.zeros((row_count, length), np.float32) for key in token_extras}
    for row, indices in enumerate(rows):
        offset, segment = 0, 0
        for slot, index in enumerate(indices):
            size = len(sequences[index])
            end = offset + size
            tokens[row, offset:end] = sequences[index]
            starts = [start for start in (segment_starts[index] if segment_starts else (0,)) if start < size] or [0]
            for begin, stop in zip(starts, [*starts[1:], size], strict=True):
                segment += 1
                attention_mask[row, offset + begin:offset + stop] = segment
                positions[row, offset + begin:offset + stop] = np.arange(stop - begin, dtype=np.int32)
            loss_mask[row, offset:end] = loss_masks[index]
            if slot > 0:
                # Predicted from the previous episode's last token, where alone nothing predicts it.
                loss_mask[row, offset] = 0.0
            if behaviour_logprobs is not None:
                behaviour[row, offset:end] = behaviour_logprobs[index]
            for key, values in token_extras.items():
                extras[key][row, offset:end] = values[index]
            episodes[row, offset:end] = slot + 1
            if advantages is not None:
                advantage[row, slot] = advantages[index]
            offset = end
    return TrainBatch(
        tokens=jnp.asarray(tokens),
        positions=jnp.asarray(positions),
        attention_mask=jnp.asarray(attention_mask),
        loss_mask=jnp.asarray(loss_mask),
        advantages=jnp.asarray(advantage),
        behaviour_logprobs=jnp.asarray(behaviour),
        extras={key: jnp.asarray(values) for key, values in extras.items()},
        episodes=jnp.asarray(episodes),
    )


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
    token_extras: dict[str, list[list[float]]] | None = None,
) -> TrainBatch:
    """Right-pad sequences to the smallest length bucket that fits, and to ``batch_size`` rows.

    Extra rows are fully masked (no attention, loss mask 0, advantage 0), so
    a partial batch trains exactly like the same sequences alone. Missing
    ``behaviour_logprobs`` or ``advantages`` (SFT) become zeros. A sequence with
    ``segment_starts`` beyond 0 holds several contexts: each gets its own segment
    id and positions from 0, so it trains as if alone. ``token_extras``: per-token
    values laid out like ``sequences`` (PPO's token rewards), padded into ``extras``.

    Raises:
      ValueError: more sequences than ``batch_size``, a sequence longer than
        the largest bucket, or per-token lists whose lengths do not match.
    """
    if len(sequences) > batch_size:
        raise ValueError(f"{len(sequences)} sequences do not fit batch_size={batch_size}")
    token_extras = token_extras or {}
    _check_lengths(sequences, loss_masks=loss_masks, behaviour_logprobs=behaviour_logprobs,
                   advantages=advantages, token_extras=token_extras)
    batch = _laid_out(sequences, [[index] for index in range(len(sequences))], row_count=batch_size,
                      length=_length_bucket(sequences, length_buckets), episode_slots=1, loss_masks=loss_masks,
                      segment_starts=segment_starts, behaviour_logprobs=behaviour_logprobs, advantages=advantages,
                      token_extras=token_extras, pad_id=pad_id)
    # One episode a row: a row's advantage, and no episode numbers to read.
    return batch.replace(advantages=batch.advantages[:, 0], episodes=None)


def pack_batch(
    sequences: list[list[int]],
    *,
    loss_masks: list[list[int]],
    segment_starts: list[tuple[int, ...]] | None = None,
    behaviour_logprobs: list[list[float]] | None,
    advantages: list[float] | None,
    length_buckets: tuple[int, ...],
    pad_id: int,
    row_multiple: int = 1,
    row_tokens: int | None = None,
    padding_target: float | None = None,
    micro_batch_tokens: int | None = None,
    token_extras: dict[str, list[list[float]]] | None = None,
) -> TrainBatch:
    """Episodes packed several to a row: of the smallest length bucket that holds the longest, of
    ``row_tokens`` where that is longer (``memory.pack_row_tokens``), or, with ``padding_target``
    (``memory.pack_padding_target``), of the shortest of :func:`tandem.configs.memory.packed_row_lengths`
    whose padding is at most it, counted as the step computes it: rows in micro-batches of
    ``micro_batch_tokens``, the last one's empty rows included.

    Each episode keeps what it has alone: its own segment ids (tokens attend only within them),
    positions from 0, its loss mask, behaviour log-probs and advantage (``advantages[:, k]`` of
    the row's ``k + 1``-th episode, as ``episodes`` numbers its tokens). The first token of an episode
    after the first in a row is never trained on: it is predicted from the previous episode's last
    token, where alone nothing predicts it. Rows are filled first-fit, longest episode first, and their
    count is rounded up to a multiple of ``row_multiple`` (the data-parallel ways), so a step compiles
    once per row count and length; ``K`` is the most episodes a row holds, rounded up to a power of
    two. ``token_extras``: as :func:`pad_batch`'s.

    Raises:
      ValueError: a sequence longer than the largest bucket, or per-token lists whose lengths do not match.
    """
    token_extras = token_extras or {}
    _check_lengths(sequences, loss_masks=loss_masks, behaviour_logprobs=behaviour_logprobs,
                   advantages=advantages, token_extras=token_extras)
    tokens = sum(len(sequence) for sequence in sequences)
    # (padding, length, rows, row count); the first length that meets the target is the least padded yet.
    least_padded = None
    for length in packed_row_lengths(_length_bucket(sequences, length_buckets), pack_row_tokens=row_tokens,
                                     pack_padding_target=padding_target):
        rows = _first_fit(sequences, length)
        row_count = max(1, -(-len(rows) // row_multiple)) * row_multiple
        padding = 1.0 - tokens / computed_slots_of(row_count, length, micro_batch_tokens, multiple=row_multiple)
        if least_padded is None or padding < least_padded[0]:
            least_padded = (padding, length, rows, row_count)
        if padding_target is None or padding <= padding_target:
            break
    _, length, rows, row_count = least_padded
    per_row = max((len(indices) for indices in rows), default=1)
    return _laid_out(sequences, rows, row_count=row_count, length=length,
                     episode_slots=1 << (per_row - 1).bit_length(), loss_masks=loss_masks,
                     segment_starts=segment_starts, behaviour_logprobs=behaviour_logprobs, advantages=advantages,
                     token_extras=token_extras, pad_id=pad_id)


def _first_fit(sequences: list[list[int]], length: int) -> list[list[int]]:
    """The indices of ``sequences`` in rows of ``length`` slots: first fit, longest first."""
    free: list[int] = []  # each row's free slots
    rows: list[list[int]] = []
    for index in sorted(range(len(sequences)), key=lambda index: -len(sequences[index])):
        size = len(sequences[index])
        row = next((row for row, room in enumerate(free) if room >= size), None)
        if row is None:
            free.append(length)
            rows.append([])
            row = len(free) - 1
        free[row] -= size
        rows[row].append(index)
    return rows


def batch_tokens(batch: TrainBatch) -> int:
    """Tokens the batch trains on (its attention mask), counted on the host.

    ``batch.attention_mask.sum()`` would dispatch a device reduction and wait
    for it: about 0.4 ms a step on CPU, most of the profiling's whole cost.
    The mask already sits where the host can read it (or is a few kB away).
    """
    return int(np.count_nonzero(np.asarray(batch.attention_mask)))
