"""Held-out evaluation on datasets: the policy's loss on rows SFT never trains on.

A run's ``evaluation.datasets`` name dataset versions of its project. Each
version's held-out split (``tandem.contracts.dataset_rows_held_out``) is set
apart when the trainer loads it, and at every evaluation point the trainer
scores the version it just published on the first ``evaluation.dataset_rows``
of them: the mean negative log-likelihood of their assistant tokens (the
tokens SFT would train), its exponential, and the share of those tokens the
policy ranks first. It is a forward pass on the trainer, no generation, so it
costs a fraction of one SFT step per batch of rows.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from tandem.contracts import EvaluationReport
from trainer.datasets import Conversation, DatasetSource
from trainer.evaluation import FinishedEvaluation
from trainer.token_statistics import policy_token_statistics
from trainer.train_batch import TrainBatch
from trainer.train_step import DEFAULT_LOGITS_CHUNK_TOKENS


@functools.partial(jax.jit, static_argnums=(0,))
def held_out_token_statistics(graphdef: nnx.GraphDef, params: nnx.State, batch: TrainBatch
                              ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per row of ``batch``: the summed negative log-likelihood of its loss-masked tokens, how many of
    them the model ranks first, and how many there are (float32 [B] each; padding rows are 0)."""
    model = nnx.merge(graphdef, params)
    statistics, _ = policy_token_statistics(model, batch, chunk_tokens=DEFAULT_LOGITS_CHUNK_TOKENS)
    mask = batch.loss_mask[:, 1:].astype(jnp.float32)
    return (jnp.sum(-statistics.logprobs * mask, axis=-1), jnp.sum(statistics.argmax_hits * mask, axis=-1),
            jnp.sum(mask, axis=-1))


def ratio_interval(numerators: Sequence[float], denominators: Sequence[float], z: float = 1.96
                   ) -> tuple[float, float]:
    """95% interval of sum(numerators) / sum(denominators) over rows (the delta method's ratio estimator).

    A token mean over rows of different lengths is such a ratio; its variance is that of the rows'
    residuals ``y_i - R x_i``, over n times the mean denominator squared.
    """
    y, x = np.asarray(numerators, dtype=np.float64), np.asarray(denominators, dtype=np.float64)
    ratio = float(y.sum() / x.sum())
    if len(y) < 2:
        return (ratio, ratio)
    residuals = y - ratio * x
    half = z * math.sqrt(residuals.var(ddof=1) / len(y)) / x.mean()
    return (ratio - half, ratio + half)


def dataset_evaluation_metrics(nll: Sequence[float], correct: Sequence[float], tokens: Sequence[float]
                               ) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """``loss`` (token mean), ``perplexity`` and ``token_accuracy`` of scored rows, with 95% intervals."""
    total = float(np.sum(tokens))
    if total == 0:
        return {}, {}
    loss = float(np.sum(nll)) / total
    loss_low, loss_high = ratio_interval(nll, tokens)
    accuracy_low, accuracy_high = ratio_interval(correct, tokens)
    metrics = {"loss": loss, "perplexity": math.exp(loss), "token_accuracy": float(np.sum(correct)) / total,
               "tokens": total}
    intervals = {"loss": (loss_low, loss_high), "perplexity": (math.exp(loss_low), math.exp(loss_high)),
                 "token_accuracy": (max(0.0, accuracy_low), min(1.0, accuracy_high))}
    return metrics, intervals


@dataclass(frozen=True)
class RenderedRows:
    """Held-out rows as padded batches, and the tokens cut from rows longer than the model's context."""

    batches: tuple[TrainBatch, ...]
    rows: int
    tokens_cut: int


class DatasetEvaluations:
    """Scores each published version on the held-out rows of the run's evaluation datasets.

    ``render(conversations)`` yields padded batches of the conversations and the tokens it cut;
    ``score(batch)`` runs :func:`held_out_token_statistics` on the current policy.
    """

    def __init__(self, *, datasets: Sequence[DatasetSource], rows_per_dataset: int,
                 render: Callable[[Sequence[Conversation]], Iterator[tuple[TrainBatch, int]]],
                 score: Callable[[TrainBatch], tuple[np.ndarray, np.ndarray, np.ndarray]]):
        self._score = score
        self._datasets: list[tuple[str, RenderedRows]] = []
        # Rendered once: the same rows are scored at every evaluation point.
        for dataset in datasets:
            rows = dataset.held_out_rows[:rows_per_dataset]
            rendered = list(render(rows))
            self._datasets.append((dataset.label, RenderedRows(
                batches=tuple(batch for batch, _ in rendered), rows=len(rows),
                tokens_cut=sum(cut for _, cut in rendered))))

    def evaluate(self, *, index: int, step: int, policy_version: int) -> list[FinishedEvaluation]:
        """One report per dataset: evaluation ``index`` of ``policy_version``, published at ``step``."""
        finished = []
        for label, rendered in self._datasets:
            started = time.monotonic()
            nll, correct, tokens = [], [], []
            for batch in rendered.batches:
                row_nll, row_correct, row_tokens = self._score(batch)
                real = np.asarray(row_tokens) > 0  # padding rows, and rows with no assistant token, count for nothing
                nll += list(np.asarray(row_nll)[real])
                correct += list(np.asarray(row_correct)[real])
                tokens += list(np.asarray(row_tokens)[real])
            metrics, intervals = dataset_evaluation_metrics(nll, correct, tokens)
            metrics["tokens_cut"] = float(rendered.tokens_cut)
            metrics["wall_s"] = time.monotonic() - started
            scored = len(tokens)
            reason = "" if scored == rendered.rows else (
                f"{rendered.rows - scored} of {rendered.rows} held-out rows have no assistant token within "
                "model.max_seq_len and were not scored")
            if not rendered.rows:
                reason = f"dataset {label} has no held-out rows (see tandem.contracts.dataset_rows_held_out)"
            report = EvaluationReport(
                evaluation=index, step=step, policy_version=policy_version, kind="dataset", environment=label,
                status="complete" if scored == rendered.rows and rendered.rows else "incomplete",
                reason=reason, tasks=rendered.rows, samples_per_task=1, temperature=0.0, episodes=scored,
                metrics=metrics, intervals=intervals,
            )
            finished.append(FinishedEvaluation(report=report, records=[]))
        return finished
