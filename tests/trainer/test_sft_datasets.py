"""The SFT phase's data mix: sources drawn by weight, the same on a resume, dataset rows read page by page."""

from __future__ import annotations

import pytest

from tandem.configs.sft import SFTConfig
from tandem.contracts import (
    DATASET_HELD_OUT_FRACTION,
    DATASET_HELD_OUT_MIN_ROWS,
    DatasetRowsPage,
    DemonstrationMessage,
    MessageToolCall,
    dataset_rows_held_out,
)
from trainer.datasets import DatasetHasNoRowsError, SFTMix, load_dataset, with_written_calls


def _row(answer: str, *, split: str | None = None) -> dict:
    return {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say it."},
                         {"role": "assistant", "content": answer}], "metadata": {"split": split} if split else {}}


class FakePlatform:
    def __init__(self, rows):
        self.rows, self.asked = rows, []

    def dataset_rows(self, run_id, name, version, *, offset, limit, between_retries=lambda: None):
        self.asked.append((offset, limit))
        return DatasetRowsPage(dataset=name, version=version, offset=offset, total=len(self.rows),
                               rows=self.rows[offset:offset + limit])


def test_a_dataset_is_read_page_by_page_as_demonstration_messages():
    platform = FakePlatform([_row(str(n), split="train") for n in range(5)])
    beats = []
    dataset = load_dataset(platform, 7, name="support", version=2, weight=1.0, tool_call_format="hermes",
                           between_pages=lambda: beats.append(1), page_size=2)

    assert platform.asked == [(0, 2), (2, 2), (4, 2)] and len(beats) == 3
    assert dataset.label == "support@2" and len(dataset.rows) == 5 and dataset.held_out_rows == ()
    # The system message joins the prompt: the layouts open an episode with one prompt.
    assert dataset.rows[3][0] == DemonstrationMessage(role="user", content="Be brief.\n\nSay it.")
    assert dataset.rows[3][1].content == "3"


def test_an_assistants_calls_are_written_after_its_text_in_the_runs_format():
    message = DemonstrationMessage(role="assistant", content="Let me compute.",
                                   tool_calls=(MessageToolCall(name="calc", arguments={"expression": "2+2"}),))
    hermes, = with_written_calls([message], "hermes")
    tandem, = with_written_calls([message.model_copy(update={"content": ""})], "tandem")

    assert hermes.content == 'Let me compute.\n<tool_call>\n{"name": "calc", "arguments": {"expression": "2+2"}}\n</tool_call>'
    assert tandem.content == "calc(2+2)"


def _dataset(name, rows, weight):
    platform = FakePlatform(rows)
    return load_dataset(platform, 1, name=name, version=1, weight=weight, tool_call_format="tandem")


def test_each_step_draws_its_sources_by_weight_and_the_same_again_on_a_resume():
    datasets = [_dataset("a", [_row("a")], 3.0), _dataset("b", [_row("b")], 1.0)]
    mix = SFTMix.for_config(SFTConfig(datasets=[{"name": "a", "weight": 3}, {"name": "b"}]), run_seed=5,
                            batch_size=400, datasets=datasets)
    counts = mix.counts(0)

    assert sum(counts) == 400 and counts[-1] == 0  # datasets given: no demonstrations by default
    assert 250 < counts[0] < 350  # about 3:1
    again = SFTMix(run_seed=5, batch_size=400, datasets=datasets, demonstrations_weight=0.0)
    assert again.counts(0) == counts and again.counts(1) != counts
    examples = mix.dataset_examples(0, counts)
    assert [example[1].content for example in examples] == ["a"] * counts[0] + ["b"] * counts[1]
    assert mix.metrics(counts, demonstrations_used=0) == {"sft/rows/0": counts[0], "sft/rows/1": counts[1]}


def test_demonstrations_alone_are_the_whole_batch_as_before():
    mix = SFTMix.for_config(SFTConfig(), run_seed=0, batch_size=8, datasets=[])
    assert mix.counts(3) == [8]
    assert mix.dataset_examples(3, [8]) == []
    assert mix.metrics([8], demonstrations_used=8) == {"sft/rows/demonstrations": 8.0}


def test_dataset_rows_render_like_demonstrations_and_only_the_assistant_is_trained():
    from types import SimpleNamespace

    import numpy as np

    from environments import Tool
    from policy import load_tokenizer, prompt_layout
    from tandem.configs.run import RunConfig
    from tandem.contracts import stored_row_messages
    from trainer.run_loop import RunTrainer, length_buckets

    config = RunConfig.model_validate({"sft_batch_size": 2})
    tokenizer = load_tokenizer(config.model.tokenizer)
    layout = prompt_layout(config.model, tokenizer)
    trainer = SimpleNamespace(
        prompt_layout=layout, config=config, run_id=1, tokenizer=tokenizer, _demonstration_tokens_cut=0,
        _buckets=length_buckets(config.model.max_seq_len),
        environment_tools=(Tool(name="calc", description="", parameters={"type": "object"}, run=None),))
    row = {"messages": [{"role": "user", "content": "What is 2*3?"},
                        {"role": "assistant", "content": "", "tool_calls": [
                            {"name": "calc", "arguments": {"expression": "2*3"}}]},
                        {"role": "tool", "content": "6"}, {"role": "assistant", "content": "A:6"}]}
    messages = with_written_calls(stored_row_messages(row), layout.tool_call_format)

    batch = RunTrainer._demonstration_batch(trainer, [messages])

    tokens, mask = np.asarray(batch.tokens[0]), np.asarray(batch.loss_mask[0])
    # The byte tokenizer: ids below 256 are the bytes themselves, the rest its special tokens.
    trained = bytes(int(token) for token, kept in zip(tokens, mask, strict=True) if kept and int(token) < 256)
    # Both assistant turns, the call written in the run's format; never the prompt or the tool's answer.
    assert trained == b"calc(2*3)A:6"


def test_sft_never_draws_a_held_out_row_and_the_split_is_the_same_in_every_run():
    rows = [_row(f"answer {n}") for n in range(400)]
    held_out = dataset_rows_held_out(rows)
    # A fixed share by hash: about a twentieth, never none of 400, the same rows every time.
    assert 0.02 < sum(held_out) / len(rows) < 0.09 and held_out == dataset_rows_held_out(list(rows))
    assert DATASET_HELD_OUT_FRACTION == 0.05
    # Too few rows to hold a twentieth out: none is.
    assert dataset_rows_held_out(rows[:DATASET_HELD_OUT_MIN_ROWS - 1]) == [False] * (DATASET_HELD_OUT_MIN_ROWS - 1)
    # A row keeps its side whatever the rows around it (another version, another order).
    assert dataset_rows_held_out(rows[::-1]) == held_out[::-1]
    dataset = _dataset("support", rows, 1.0)
    held_out_answers = {row["messages"][-1]["content"] for row, out in zip(rows, held_out, strict=True) if out}
    assert {conversation[-1].content for conversation in dataset.held_out_rows} == held_out_answers
    assert len(dataset.rows) + len(dataset.held_out_rows) == 400

    mix = SFTMix.for_config(SFTConfig(datasets=[{"name": "support"}]), run_seed=3, batch_size=64, datasets=[dataset])
    drawn = {example[-1].content for step in range(200) for example in mix.dataset_examples(step, mix.counts(step))}
    assert drawn and not drawn & held_out_answers
    assert len(drawn) > 300  # it does draw from the rest


def test_rows_that_declare_their_split_keep_it():
    rows = [_row("a", split="train"), _row("b", split="evaluation"), _row("c"), _row("d", split="test"),
            _row("e", split="validation")]
    assert dataset_rows_held_out(rows) == [False, True, False, True, True]
    dataset = _dataset("declared", rows, 1.0)
    assert [row[-1].content for row in dataset.rows] == ["a", "c"]
    assert [row[-1].content for row in dataset.held_out_rows] == ["b", "d", "e"]


def test_a_dataset_whose_every_row_is_held_out_cannot_be_trained_on():
    dataset = _dataset("exam", [_row("a", split="evaluation"), _row("b", split="test")], 1.0)
    with pytest.raises(DatasetHasNoRowsError, match="exam@1 has no training rows: all 2 are held out"):
        SFTMix.for_config(SFTConfig(datasets=[{"name": "exam"}]), run_seed=0, batch_size=4, datasets=[dataset])
