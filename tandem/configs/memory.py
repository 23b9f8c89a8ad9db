"""How the trainer bounds its memory as batches grow: micro-batches, chunked logits, remat and packing.

A part of :class:`tandem.configs.run.RunConfig`. None of the settings changes what a step computes, only
how much of it exists at once: a step in micro-batches equals the step in one batch (its losses
divide by the whole step's token and episode counts), and chunked logits give the same log-probs.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: How much longer each packed row length tried for ``pack_padding_target`` is than the last, and how far
#: past the longest episode's bucket they go: an episode longer than half a row shares it only with short
#: ones, so rows of 1.4 times the longest hold them tightly (bench/README.md), and attention grows beyond.
PACK_ROW_STEP_TOKENS = 128
PACK_ROW_GROWTH = 1.5

#: What the backward pass keeps of each transformer block (``policy.model.REMAT_POLICIES`` maps each to JAX's).
RematPolicy = Literal["none", "full", "save_matmuls"]


class TrainerMemoryConfig(BaseModel):
    """The trainer's activation memory: what one micro-batch holds, and how many logits exist at once."""

    model_config = ConfigDict(extra="forbid")

    micro_batch_tokens: int | None = Field(
        None, ge=1, le=16_777_216,
        description="Token budget of one micro-batch (rows x the batch's padded length, at least one row). "
        "A step of any number of episodes runs as micro-batches whose gradients accumulate inside the "
        "jitted step and are applied once; activations exist for one micro-batch at a time. Costs one "
        "scan iteration per micro-batch (and, for PPO, one extra forward pass of the critic). null: the "
        "whole step at once.",
    )
    logits_chunk_tokens: int = Field(
        8192, ge=1, le=16_777_216,
        description="Tokens of a (micro-)batch whose logits exist at once: log-probs, entropy and the KL "
        "estimate come from the final hidden states in chunks of the sequence, recomputed in the backward "
        "pass, so no [batch, length, vocabulary] tensor is ever held. Memory: this x vocabulary x 4 bytes "
        "(8,192 x 49,152 is 1.6 GB); smaller chunks cost more, shorter matmuls.",
    )
    remat: RematPolicy = Field(
        "none",
        description="Activation checkpointing of each transformer block in the backward pass. none: keep "
        "every activation (fastest). full: keep only each block's input and recompute the block (about one "
        "more forward pass, roughly +30% step time; activations of one block at a time). save_matmuls: keep "
        "the matmul outputs and recompute the element-wise work between them (norms, rotary, softmax, "
        "activations): a few percent slower, most of the saving where those dominate.",
    )
    attention_query_chunk_tokens: int | None = Field(
        None, ge=16, le=1_048_576,
        description="Queries of a row that the trained forward pass attends at once. A longer row attends "
        "this many at a time, each chunk only to the keys at or before its last slot (and within a sliding "
        "layer's window), and its backward pass recomputes one chunk's scores at a time: scores of chunk x "
        "length per head instead of length x length, and causality skips the score FLOPs above the "
        "chunks' diagonal (a quarter of them at rows of 1,024 in chunks of 512). The result is the whole "
        "attention's, up to float rounding. On a 2-core CPU chunks of 512 made SmolLM2's step 1.3 to 1.4 "
        "times faster, and its process 0.17 to 0.24 GB larger. null: every row attends whole.",
    )
    pack_episodes: bool = Field(
        False,
        description="Pack a step's episodes several to a row (first fit, longest first) instead of one to "
        "each row padded to the longest: each keeps its own attention segments, positions from 0, loss "
        "mask and advantage, so the losses and gradients are those of the unpacked batch, with fewer rows "
        "of padding to compute. Rows are a multiple of the data-parallel ways; each new row count "
        "compiles the step once.",
    )
    pack_row_tokens: int | None = Field(
        None, ge=16, le=1_048_576,
        description="Length of every packed row, with pack_episodes. null: the length bucket of the step's "
        "longest episode (or as pack_padding_target chooses). A longer row packs tighter: an episode longer "
        "than half a row shares it only with short ones, so rows of the longest episode's length keep about "
        "10% padding. Cost: a token's attention spans its row's earlier slots (the segments mask it), so "
        "it grows with the row, and one micro-batch holds fewer rows. A step whose longest episode's bucket "
        "is longer uses that bucket instead.",
    )
    pack_padding_target: float | None = Field(
        None, ge=0.0, lt=1.0,
        description="With pack_episodes and no pack_row_tokens: the most padding a step should compute, as a "
        "share of its slots (its last micro-batch's empty rows included, as trainer/padding_fraction counts "
        "it). A step whose rows of its longest episode's bucket leave more packs into longer rows, "
        f"{PACK_ROW_STEP_TOKENS} tokens longer at a time up to {PACK_ROW_GROWTH} times the bucket, and takes "
        "the shortest that meets it (the least padded where none does). Each row length compiles the step "
        "once per row count. null: rows of the bucket.",
    )

    @model_validator(mode="after")
    def _rows_are_packed(self):
        for name in ("pack_row_tokens", "pack_padding_target"):
            if getattr(self, name) is not None and not self.pack_episodes:
                raise ValueError(f"memory.{name} sets how episodes are packed: it needs memory.pack_episodes true")
        if self.pack_row_tokens is not None and self.pack_padding_target is not None:
            raise ValueError("memory.pack_row_tokens fixes the row length that memory.pack_padding_target would "
                             "choose: set one of them")
        return self


def packed_row_lengths(longest_bucket: int, *, pack_row_tokens: int | None = None,
                       pack_padding_target: float | None = None) -> tuple[int, ...]:
    """The row lengths a packed step may take, shortest first: ``pack_row_tokens`` (or the step's longest
    episode's bucket where that is longer); with ``pack_padding_target``, the bucket and the lengths
    :data:`PACK_ROW_STEP_TOKENS` apart up to :data:`PACK_ROW_GROWTH` times it; else the bucket alone."""
    if pack_row_tokens is not None:
        return (max(longest_bucket, pack_row_tokens),)
    if pack_padding_target is None:
        return (longest_bucket,)
    longest = int(longest_bucket * PACK_ROW_GROWTH)
    return (longest_bucket, *range(longest_bucket + PACK_ROW_STEP_TOKENS, longest + 1, PACK_ROW_STEP_TOKENS))


def budget_rows(rows: int, length: int, micro_batch_tokens: int | None) -> int:
    """The most rows of a ``[rows, length]`` batch one micro-batch may hold: as many as
    ``micro_batch_tokens`` holds (at least one); all of them without a budget. The memory plan counts by it."""
    if micro_batch_tokens is None:
        return rows
    return max(1, min(rows, micro_batch_tokens // length))


def micro_batch_rows(rows: int, length: int, micro_batch_tokens: int | None, *, multiple: int = 1) -> int:
    """Rows of each micro-batch of a ``[rows, length]`` batch, which the train step splits by: of the
    counts from :func:`budget_rows` down to half of it (multiples of ``multiple``, the data-parallel
    ways, where the budget allows one), the one that leaves the fewest empty rows in the last
    micro-batch, the largest of those. 10 rows under a budget of 8 go as 2 micro-batches of 5, not
    2 of 8 with 6 rows of padding computed."""
    most = budget_rows(rows, length, micro_batch_tokens)
    if most == rows or most < multiple:
        return most
    candidates = [count for count in range(most, (most - 1) // 2, -1) if count % multiple == 0]
    return min(candidates, key=lambda count: (-(-rows // count) * count - rows, -count))


def computed_slots_of(rows: int, length: int, micro_batch_tokens: int | None, *, multiple: int = 1) -> int:
    """Token slots a step computes for ``rows`` rows of ``length``: the rows, and the empty rows that fill
    its last micro-batch (:func:`micro_batch_rows`). A step's padding is these less its tokens."""
    rows_each = micro_batch_rows(rows, length, micro_batch_tokens, multiple=multiple)
    return -(-rows // rows_each) * rows_each * length
