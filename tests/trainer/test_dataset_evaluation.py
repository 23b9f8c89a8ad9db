"""Held-out evaluation on a dataset: the trainer's scores of its held-out rows, against a hand computation."""

from __future__ import annotations

import math

import jax
import numpy as np
import pytest
from flax import nnx

from environments import Tool
from policy import load_tokenizer, prompt_layout
from tandem.configs.run import RunConfig
from tandem.contracts import DatasetRowsPage
from trainer.dataset_evaluation import (
    DatasetEvaluations,
    dataset_evaluation_metrics,
    held_out_token_statistics,
    ratio_interval,
)
from trainer.datasets import load_dataset, rendered_conversations
from trainer.run_loop import length_buckets
from trainer.train_batch import pad_batch
from trainer.train_state import initial_train_state, make_optimizer


class RowsPlatform:
    """The platform's trainer route for dataset rows, as the trainer reads it (one page)."""

    def __init__(self, rows):
        self.rows = rows

    def dataset_rows(self, run_id, name, version, *, offset, limit, between_retries=lambda: None):
        return DatasetRowsPage(dataset=name, version=version, offset=offset, total=len(self.rows),
                               rows=self.rows[offset:offset + limit])


def _row(question: str, answer: str, split: str) -> dict:
    return {"messages": [{"role": "user", "content": question}, {"role": "assistant", "content": answer}],
            "metadata": {"split": split}}


def test_the_ratio_interval_is_the_delta_method_by_hand():
    nll, tokens = [2.0, 6.0, 1.0], [1.0, 3.0, 2.0]
    ratio = 9.0 / 6.0
    residuals = [2.0 - ratio * 1.0, 6.0 - ratio * 3.0, 1.0 - ratio * 2.0]  # 0.5, 1.5, -2.0
    mean = sum(residuals) / 3
    variance = sum((r - mean) ** 2 for r in residuals) / 2
    half = 1.96 * math.sqrt(variance / 3) / 2.0  # mean denominator 2
    assert ratio_interval(nll, tokens) == pytest.approx((ratio - half, ratio + half))

    metrics, intervals = dataset_evaluation_metrics(nll, [1.0, 2.0, 2.0], tokens)
    assert metrics["loss"] == pytest.approx(1.5) and metrics["perplexity"] == pytest.approx(math.exp(1.5))
    assert metrics["token_accuracy"] == pytest.approx(5 / 6) and metrics["tokens"] == 6
    assert intervals["perplexity"] == pytest.approx(tuple(math.exp(bound) for bound in intervals["loss"]))


def test_held_out_rows_are_scored_as_the_mean_nll_of_their_assistant_tokens():
    config = RunConfig.model_validate({"sft_batch_size": 2, "seed": 3})
    tokenizer = load_tokenizer(config.model.tokenizer)
    layout = prompt_layout(config.model, tokenizer)
    tools = (Tool(name="calc", description="", parameters={"type": "object"}, run=None),)
    graphdef, state = initial_train_state(config, vocab_size=tokenizer.vocab_size, needs_value_head=False,
                                          optimizer=make_optimizer(config.learning_rate, config.optimizer))
    rows = [_row("What is 2+2?", "4", "train"), _row("What is 3*3?", "9", "evaluation"),
            _row("What is 7-5?", "The answer is 2", "test"), _row("Name a colour.", "blue", "evaluation")]
    dataset = load_dataset(RowsPlatform(rows), 1, name="exam", version=3, weight=1.0,
                           tool_call_format=layout.tool_call_format)
    assert len(dataset.held_out_rows) == 3 and len(dataset.rows) == 1
    buckets = length_buckets(config.model.max_seq_len)

    def render(conversations):
        for first in range(0, len(conversations), 2):
            sequences, masks, cut = rendered_conversations(layout, tools, conversations[first:first + 2],
                                                           max_len=config.model.max_seq_len)
            yield pad_batch(sequences, loss_masks=masks, behaviour_logprobs=None, advantages=None, batch_size=2,
                            length_buckets=buckets, pad_id=tokenizer.pad_id), cut

    def score(batch):
        return jax.device_get(held_out_token_statistics(graphdef, state.params, batch))

    evaluations = DatasetEvaluations(datasets=[dataset], rows_per_dataset=2, render=render, score=score)
    (finished,) = evaluations.evaluate(index=2, step=320, policy_version=21)
    report = finished.report
    assert (report.kind, report.environment, report.status, report.evaluation) == ("dataset", "exam@3", "complete", 2)
    assert (report.tasks, report.episodes, report.policy_version, finished.records) == (2, 2, 21, [])

    # By hand: the model's log-softmax at each assistant token, in numpy, over the first two held-out rows.
    model = nnx.merge(graphdef, state.params)
    sequences, masks, _ = rendered_conversations(layout, tools, dataset.held_out_rows[:2],
                                                 max_len=config.model.max_seq_len)
    nll_sum, correct_sum, token_count = 0.0, 0, 0
    for sequence, mask in zip(sequences, masks, strict=True):
        tokens = np.asarray(sequence)[None]
        positions = np.arange(len(sequence))[None]
        logits = np.asarray(model(tokens, positions, np.ones_like(tokens)), dtype=np.float64)[0]
        log_probs = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
            - logits.max(-1, keepdims=True)
        for slot in range(1, len(sequence)):
            if mask[slot]:
                nll_sum -= log_probs[slot - 1, sequence[slot]]
                correct_sum += int(np.argmax(logits[slot - 1]) == sequence[slot])
                token_count += 1
    assert token_count > 0 and report.metrics["tokens"] == token_count
    assert report.metrics["loss"] == pytest.approx(nll_sum / token_count, rel=1e-4)
    assert report.metrics["token_accuracy"] == pytest.approx(correct_sum / token_count)
    assert report.metrics["perplexity"] == pytest.approx(math.exp(nll_sum / token_count), rel=1e-4)
    low, high = report.intervals["loss"]
    assert low <= report.metrics["loss"] <= high
    assert report.metrics["tokens_cut"] == 0


def test_a_dataset_without_held_out_rows_is_reported_incomplete_with_why():
    dataset = load_dataset(RowsPlatform([_row("a?", "b", "train")] * 3), 1, name="small", version=1, weight=1.0,
                           tool_call_format="tandem")
    evaluations = DatasetEvaluations(datasets=[dataset], rows_per_dataset=8, render=lambda rows: iter(()),
                                     score=lambda batch: None)
    (finished,) = evaluations.evaluate(index=0, step=0, policy_version=0)
    assert finished.report.status == "incomplete" and "small@1 has no held-out rows" in finished.report.reason
