"""The trainer's jitted update: one pure ``train_step(state, batch) -> (state, metrics)``.

Batches are right-padded to a few length buckets and a fixed row count by
:func:`trainer.train_batch.pad_batch`, so after one compilation per bucket the step never
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

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import PartitionSpec

from policy import Transformer
from tandem.configs.memory import computed_slots_of, micro_batch_rows
from tandem.runtime.resource_usage import release_free_pages
from trainer.losses import StepTotals, combine_metrics, finish_metrics, step_totals
from trainer.token_statistics import policy_token_statistics
from trainer.train_batch import TrainBatch
from trainer.train_state import TrainState, trainable_params

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
    loss_fn: LossFn, *, temperature: float = 1.0, logits_chunk_tokens: int = DEFAULT_LOGITS_CHUNK_TOKENS,
    remat: str = "none",
) -> StepLoss:
    """Lift a loss of ``(token statistics, batch, totals)`` to a :class:`StepLoss` of the model: the
    statistics come from its hidden states in chunks (:func:`trainer.token_statistics.policy_token_statistics`),
    whose backward pass keeps of each block what ``remat`` says (``policy.REMAT_POLICIES``)."""

    def model_loss(model: Transformer, batch: TrainBatch, totals: StepTotals):
        statistics, _ = policy_token_statistics(model, batch, temperature=temperature,
                                                chunk_tokens=logits_chunk_tokens, remat=remat)
        return loss_fn(statistics, batch, totals)

    return StepLoss(model_loss)


def split_micro_batches(batch: TrainBatch, rows_each: int, shards: int = 1) -> TrainBatch:
    """``batch`` as ``[micro-batches, rows_each, ...]``. With ``shards``, each micro-batch takes
    ``rows_each // shards`` rows of each of the ``shards`` contiguous blocks the batch's rows are sharded
    in, so a data shard's micro-batches hold only its own rows and no row moves between devices. Each
    block's last micro-batch is filled with empty rows (no token attends, trains or counts), which leave
    the loss and the gradients as they are."""
    rows = batch.tokens.shape[0]
    local, per_shard = rows // shards, rows_each // shards
    count = -(-local // per_shard)

    def split(values: jax.Array) -> jax.Array:
        values = values.reshape(shards, local, *values.shape[1:])
        values = jnp.pad(values, [(0, 0), (0, count * per_shard - local)] + [(0, 0)] * (values.ndim - 2))
        values = values.reshape(shards, count, per_shard, *values.shape[2:])
        return jnp.swapaxes(values, 0, 1).reshape(count, rows_each, *values.shape[3:])

    return jax.tree.map(split, batch)


def computed_slots(batch: TrainBatch, micro_batch_tokens: int | None, *, batch_ways: int = 1) -> int:
    """Token slots the step computes for ``batch``: its rows, and the empty rows that fill its last
    micro-batch (:func:`split_micro_batches`), times its length. A step's padding is these less its tokens.
    ``batch_ways``: the devices a batch's rows are split over, as the step counts them."""
    rows, length = batch.tokens.shape
    return computed_slots_of(rows, length, micro_batch_tokens, multiple=batch_ways)


def join_micro_batches(values: jax.Array, rows: int) -> jax.Array:
    """The inverse of :func:`split_micro_batches` for one array: ``[micro-batches, rows_each, ...]`` to
    its first ``rows`` rows."""
    return values.reshape(-1, *values.shape[2:])[:rows]


def per_row_in_micro_batches(compute: Callable[[TrainBatch], jax.Array], batch: TrainBatch,
                             rows_each: int) -> jax.Array:
    """``compute``'s per-row result (no gradient) over ``batch``, ``rows_each`` rows at a time, so that
    its activations are one micro-batch's; in one call when the batch is no larger."""
    rows = batch.tokens.shape[0]
    if rows_each >= rows:
        return compute(batch)
    return join_micro_batches(jax.lax.map(compute, split_micro_batches(batch, rows_each)), rows)


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
        # On a mesh with a data axis, micro-batches accumulate each data shard's gradients where they are
        # and reduce them over ``data`` once per step. Within a data shard, fsdp reduce-scatters each
        # micro-batch's gradients as they come (as ZeRO does), so each device holds only its share.
        self._mesh = None if shardings is None else shardings.batch.mesh
        self._data_shards = 1 if self._mesh is None else int(self._mesh.shape["data"])
        self._row_shards = 1 if self._mesh is None else int(self._mesh.shape["data"] * self._mesh.shape["fsdp"])
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
        traced = self._trace_count
        result = self._step(state, batch)
        if self._trace_count != traced:
            release_free_pages()  # the compiler's working memory, freed by now but kept by the allocator
        return result

    def compiled(self, state: TrainState, batch: TrainBatch):
        """The step compiled for ``state`` and ``batch``'s shapes without running it (called alike)."""
        compiled = self._step.lower(state, batch).compile()
        release_free_pages()
        return compiled

    def _accumulated_per_shard(self, trained: nnx.State, frozen: nnx.State, batch: TrainBatch,
                               totals: StepTotals, rows_each: int):
        """The step's float32 gradient sum, loss and metrics over its micro-batches, with each data shard's
        gradients accumulated on its own devices and reduced over the ``data`` axis once, after the last
        micro-batch, instead of once per micro-batch (manual over ``data``, GSPMD's for the other axes)."""
        def local(trained, frozen, micro_batches, totals):
            def loss_of(trained, micro_batch):
                return self._loss.loss(nnx.merge(self._graphdef, trained, frozen), micro_batch, totals)

            grads, loss, per_micro_batch = _accumulated(
                jax.value_and_grad(loss_of, has_aux=True), trained, micro_batches)
            metrics = {name: (jax.lax.pmin(value, "data") if name.endswith("_min") else
                              jax.lax.pmax(value, "data") if name.endswith("_max") else
                              jax.lax.psum(value, "data"))
                       for name, value in combine_metrics(per_micro_batch).items()}
            return jax.lax.psum(grads, "data"), jax.lax.psum(loss, "data"), metrics

        replicated, rows_over_data = PartitionSpec(), PartitionSpec(None, "data")
        # Unchecked: the gradients of the replicated parameters are this shard's own until the psum.
        return jax.shard_map(
            local, mesh=self._mesh, axis_names={"data"}, check_vma=False,
            in_specs=(replicated, replicated, rows_over_data, replicated),
            out_specs=(replicated, replicated, replicated),
        )(trained, frozen, split_micro_batches(batch, rows_each, self._row_shards), totals)

    def _traced(
        self, state: TrainState, batch: TrainBatch
    ) -> tuple[TrainState, dict[str, jax.Array]]:
        # Runs only while tracing, so it counts compilations.
        self._trace_count += 1

        trained, frozen = trainable_params(state.params)
        rows, length = batch.tokens.shape
        rows_each = micro_batch_rows(rows, length, self._micro_batch_tokens, multiple=self._row_shards)
        step_metrics: dict[str, jax.Array] = {}
        if self._loss.prepare is not None:
            batch, step_metrics = self._loss.prepare(nnx.merge(self._graphdef, trained, frozen), batch, rows_each)
        totals = step_totals(batch)

        def loss_of(trained: nnx.State, micro_batch: TrainBatch) -> tuple[jax.Array, dict[str, jax.Array]]:
            return self._loss.loss(nnx.merge(self._graphdef, trained, frozen), micro_batch, totals)

        gradient = jax.value_and_grad(loss_of, has_aux=True)
        if rows_each == rows:
            (loss, metrics), grads = gradient(trained, batch)
        elif self._data_shards > 1 and rows_each % self._row_shards == 0:
            grads, loss, metrics = self._accumulated_per_shard(trained, frozen, batch, totals, rows_each)
            grads = jax.tree.map(lambda grad, param: grad.astype(param.dtype), grads, trained)
        else:
            grads, loss, per_micro_batch = _accumulated(gradient, trained, split_micro_batches(batch, rows_each))
            grads = jax.tree.map(lambda grad, param: grad.astype(param.dtype), grads, trained)
            metrics = combine_metrics(per_micro_batch)
        updates, opt_state = self._optimizer.update(grads, state.opt_state, trained)
        trained = optax.apply_updates(trained, updates)
        params = nnx.merge_state(trained, frozen)
        metrics = finish_metrics({**step_metrics, **metrics, "loss": loss, "grad_norm": optax.tree.norm(grads)})
        return TrainState(params=params, opt_state=opt_state, step=state.step + 1), metrics


def _accumulated(gradient: Callable, trained: nnx.State, micro_batches: TrainBatch):
    """``gradient`` (a ``value_and_grad`` with metrics) over ``micro_batches`` ``[count, rows, ...]`` in a
    scan: the float32 sum of their gradients, the sum of their losses, and their metrics stacked."""
    def accumulate(carry, micro_batch):
        grads_sum, loss_sum = carry
        (loss, metrics), grads = gradient(trained, micro_batch)
        grads_sum = jax.tree.map(lambda total, grad: total + grad.astype(jnp.float32), grads_sum, grads)
        return (grads_sum, loss_sum + loss), metrics

    zeros = jax.tree.map(lambda param: jnp.zeros(param.shape, jnp.float32), trained)
    (grads, loss), per_micro_batch = jax.lax.scan(accumulate, (zeros, jnp.zeros((), jnp.float32)), micro_batches)
    return grads, loss, per_micro_batch


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
