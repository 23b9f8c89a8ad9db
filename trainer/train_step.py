"""The trainer's jitted update: one pure ``train_step(state, batch) -> (state, metrics)``.

Batches are right-padded to a few length buckets and a fixed row count by
:func:`pad_batch`, so after one compilation per bucket the step never
recompiles; :attr:`TrainStep.trace_count` lets a test prove it. The state is
donated, so XLA updates parameters and optimizer moments in place.

What is trained follows from the parameters: ``policy.lora.apply_lora``
retypes the policy's own weights as ``FrozenParam``, and the step trains
every other parameter (the LoRA adapters, plus a value head if one was added
afterwards); a model without LoRA trains every ``nnx.Param``. Frozen
parameters ride along in the state unchanged. They are donated like the rest, and since the step returns them
as they came, XLA aliases each output to its input buffer: no copy, no
gradient, no optimizer moments.

With a :class:`trainer.sharding.StepShardings` the step is jitted with
explicit input and output shardings (state by parameter rules, batch over
the ``data`` and ``fsdp`` axes, metrics replicated).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from policy import FrozenParam, Transformer, split_model
from trainer.losses import StepTotals, combine_metrics, finish_metrics, step_totals
from trainer.token_statistics import policy_token_statistics

if TYPE_CHECKING:
    from trainer.losses import LossFn
    from trainer.sharding import StepShardings

# What the step differentiates: the merged model, a (micro-)batch and the whole step's totals to
# (scalar loss, scalar metrics). The model is an argument, not just its token statistics, so losses
# that need more (a value head, hidden states) fit the same step.
ModelLossFn = Callable[[Transformer, "TrainBatch", StepTotals], tuple[jax.Array, dict[str, jax.Array]]]
# Before the micro-batches, without gradient: (model, the whole step's batch, rows per micro-batch) to
# (the batch with what its loss needs of the whole step in its extras, metrics of the whole step).
StepPreparation = Callable[[Transformer, "TrainBatch", int], tuple["TrainBatch", dict[str, jax.Array]]]

#: Tokens whose logits exist at once when the token statistics are computed (in chunks of the sequence):
#: 8,192 tokens at a vocabulary of 152k are 5 GB in float32, at 49k (SmolLM2) 1.6 GB.
DEFAULT_LOGITS_CHUNK_TOKENS = 8192


@dataclass(frozen=True)
class StepLoss:
    """What a :class:`TrainStep` minimises: a loss of each micro-batch, and what is computed once per step."""

    # The loss of one micro-batch, divided by the step's totals, so micro-batches add up to the step.
    loss: ModelLossFn
    # What the loss needs of the whole step (PPO's advantages, whitened over all its tokens); None: nothing.
    prepare: StepPreparation | None = None


def on_token_statistics(
    loss_fn: LossFn, *, temperature: float = 1.0, logits_chunk_tokens: int = DEFAULT_LOGITS_CHUNK_TOKENS
) -> StepLoss:
    """Lift a loss of ``(token statistics, batch, totals)`` to a :class:`StepLoss` of the model: the
    statistics come from its hidden states in chunks (:func:`trainer.token_statistics.policy_token_statistics`)."""

    def model_loss(model: Transformer, batch: TrainBatch, totals: StepTotals):
        statistics, _ = policy_token_statistics(model, batch, temperature=temperature,
                                                chunk_tokens=logits_chunk_tokens)
        return loss_fn(statistics, batch, totals)

    return StepLoss(model_loss)


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


@flax.struct.dataclass
class TrainState:
    """Everything the update changes; a pytree, so it can be donated and checkpointed."""

    # All model parameters, trained and frozen: the second half of
    # policy.model.split_model, so nnx.merge(graphdef, params) is the model.
    params: nnx.State
    # Optimizer state of the transformation the step was built with, over the
    # trained parameters only (see trainable_params).
    opt_state: optax.OptState
    # int32 scalar, number of updates applied.
    step: jax.Array


def trainable_params(params: nnx.State) -> tuple[nnx.State, nnx.State]:
    """``(trained, frozen)``: frozen are the weights LoRA keeps fixed (none without LoRA)."""
    frozen, trained = nnx.split_state(params, FrozenParam, ...)
    return trained, frozen


def create_train_state(
    model: Transformer, optimizer: optax.GradientTransformation
) -> tuple[nnx.GraphDef[Transformer], TrainState]:
    """Split ``model`` and initialize the optimizer on its trained parameters.

    The parameters are copied: the train step donates its state, and without
    a copy the first step would delete the arrays ``model`` still refers to.
    """
    graphdef, params = split_model(model)
    params = jax.tree.map(jnp.copy, params)
    trained, _ = trainable_params(params)
    state = TrainState(params=params, opt_state=optimizer.init(trained), step=jnp.int32(0))
    return graphdef, state


def micro_batch_rows(rows: int, length: int, micro_batch_tokens: int | None) -> int:
    """Rows of each micro-batch of a ``[rows, length]`` batch: as many as ``micro_batch_tokens`` holds
    (at least one); all of them without a budget."""
    if micro_batch_tokens is None:
        return rows
    return max(1, min(rows, micro_batch_tokens // length))


def split_micro_batches(batch: TrainBatch, rows_each: int) -> TrainBatch:
    """``batch`` as ``[micro-batches, rows_each, ...]``; the last is filled with empty rows (no token
    attends, trains or counts), which leave the loss and the gradients as they are."""
    rows = batch.tokens.shape[0]
    count = -(-rows // rows_each)
    padding = count * rows_each - rows

    def split(values: jax.Array) -> jax.Array:
        values = jnp.pad(values, [(0, padding)] + [(0, 0)] * (values.ndim - 1))
        return values.reshape(count, rows_each, *values.shape[1:])

    return jax.tree.map(split, batch)


def join_micro_batches(values: jax.Array, rows: int) -> jax.Array:
    """The inverse of :func:`split_micro_batches` for one array: ``[micro-batches, rows_each, ...]`` to
    its first ``rows`` rows."""
    return values.reshape(-1, *values.shape[2:])[:rows]


class TrainStep:
    """``train_step(state, batch) -> (state, metrics)``, jitted once with the state donated.

    The caller's ``state`` is invalid after a call; use the returned one.
    Metrics are the loss function's, plus ``loss`` and ``grad_norm`` (global
    norm before clipping), as device scalars: fetch them outside the hot loop.

    With ``micro_batch_tokens`` a batch runs as micro-batches of at most that many tokens (rows of
    the batch's length bucket, at least one row), in a scan inside the jitted step: their gradients
    accumulate in float32 and the optimizer applies them once. Every loss divides by the whole
    step's totals, so the step equals the same step in one batch, while activations exist for one
    micro-batch at a time.
    """

    def __init__(
        self,
        graphdef: nnx.GraphDef[Transformer],
        optimizer: optax.GradientTransformation,
        loss_fn: StepLoss | ModelLossFn,
        shardings: StepShardings | None = None,
        micro_batch_tokens: int | None = None,
    ):
        self._graphdef = graphdef
        self._optimizer = optimizer
        self._loss = loss_fn if isinstance(loss_fn, StepLoss) else StepLoss(loss_fn)
        self._micro_batch_tokens = micro_batch_tokens
        self._trace_count = 0
        if shardings is None:
            self._step = jax.jit(self._traced, donate_argnums=(0,))
        else:
            self._step = jax.jit(
                self._traced,
                donate_argnums=(0,),
                in_shardings=(shardings.state, shardings.batch),
                out_shardings=(shardings.state, shardings.metrics),
            )

    @property
    def trace_count(self) -> int:
        """How many times the step has been traced (once per batch shape)."""
        return self._trace_count

    def __call__(
        self, state: TrainState, batch: TrainBatch
    ) -> tuple[TrainState, dict[str, jax.Array]]:
        return self._step(state, batch)

    def _traced(
        self, state: TrainState, batch: TrainBatch
    ) -> tuple[TrainState, dict[str, jax.Array]]:
        # Runs only while tracing, so it counts compilations.
        self._trace_count += 1

        trained, frozen = trainable_params(state.params)
        rows, length = batch.tokens.shape
        rows_each = micro_batch_rows(rows, length, self._micro_batch_tokens)
        step_metrics: dict[str, jax.Array] = {}
        if self._loss.prepare is not None:
            batch, step_metrics = self._loss.prepare(nnx.merge(self._graphdef, trained, frozen), batch, rows_each)
        totals = step_totals(batch)

        def loss_of(trained: nnx.State, micro_batch: TrainBatch) -> tuple[jax.Array, dict[str, jax.Array]]:
            return self._loss.loss(nnx.merge(self._graphdef, trained, frozen), micro_batch, totals)

        gradient = jax.value_and_grad(loss_of, has_aux=True)
        if rows_each == rows:
            (loss, metrics), grads = gradient(trained, batch)
        else:
            def accumulate(carry, micro_batch):
                grads_sum, loss_sum = carry
                (loss, metrics), grads = gradient(trained, micro_batch)
                grads_sum = jax.tree.map(lambda total, grad: total + grad.astype(jnp.float32), grads_sum, grads)
                return (grads_sum, loss_sum + loss), metrics

            zeros = jax.tree.map(lambda param: jnp.zeros(param.shape, jnp.float32), trained)
            (grads, loss), per_micro_batch = jax.lax.scan(
                accumulate, (zeros, jnp.zeros((), jnp.float32)), split_micro_batches(batch, rows_each))
            grads = jax.tree.map(lambda grad, param: grad.astype(param.dtype), grads, trained)
            metrics = combine_metrics(per_micro_batch)
        updates, opt_state = self._optimizer.update(grads, state.opt_state, trained)
        trained = optax.apply_updates(trained, updates)
        params = nnx.merge_state(trained, frozen)
        metrics = finish_metrics({**step_metrics, **metrics, "loss": loss, "grad_norm": optax.tree.norm(grads)})
        return TrainState(params=params, opt_state=opt_state, step=state.step + 1), metrics


def make_train_step(
    graphdef: nnx.GraphDef[Transformer],
    optimizer: optax.GradientTransformation,
    loss_fn: StepLoss | ModelLossFn,
    *,
    shardings: StepShardings | None = None,
    micro_batch_tokens: int | None = None,
) -> TrainStep:
    """Build the jitted step; ``loss_fn`` is closed over, e.g. ``on_token_statistics(sft_loss)``.

    ``shardings`` (from :func:`trainer.sharding.step_shardings`) pins the
    layout of state, batch and metrics; without it the step runs wherever
    its inputs are (one device). ``micro_batch_tokens``: see :class:`TrainStep`.
    """
    return TrainStep(graphdef, optimizer, loss_fn, shardings, micro_batch_tokens)


def train_updates(train_step: TrainStep, state: TrainState, batch: TrainBatch, *, updates: int
                  ) -> tuple[TrainState, list[dict[str, float]]]:
    """``updates`` successive updates on one batch (GRPO's mu, PPO's epochs): the new state, each one's metrics.

    The updates are dispatched back to back and fetched once at the end, so the
    device never waits on the host between them.
    """
    if updates < 1:
        raise ValueError(f"updates must be at least 1, got {updates}")
    per_update = []
    for _ in range(updates):
        state, metrics = train_step(state, batch)
        per_update.append(metrics)
    fetched = jax.device_get(per_update)
    return state, [{name: float(value) for name, value in metrics.items()} for metrics in fetched]


def mean_metrics(per_update: list[dict[str, float]]) -> dict[str, float]:
    """Each scalar metric's mean over the updates of one step (as :func:`train_updates` returns them)."""
    return {name: float(np.mean([metrics[name] for metrics in per_update])) for name in per_update[0]}


def batch_tokens(batch: TrainBatch) -> int:
    """Tokens the batch trains on (its attention mask), counted on the host.

    ``batch.attention_mask.sum()`` would dispatch a device reduction and wait
    for it: about 0.4 ms a step on CPU, most of the profiling's whole cost.
    The mask already sits where the host can read it (or is a few kB away).
    """
    return int(np.count_nonzero(np.asarray(batch.attention_mask)))
