"""The slot scheduler on its own (no JAX): admission, eviction, prefill windows, row groups."""

from __future__ import annotations

import numpy as np
import pytest

from policy.engine.scheduler import SamplingParams, Scheduler

EOS = 99


def _scheduler(**overrides) -> Scheduler:
    settings = dict(num_slots=2, max_seq_len=32, eos_id=EOS, pad_id=0)
    return Scheduler(**(settings | overrides))


def _turn(scheduler: Scheduler, session_id, prompt: list[int], generated: list[int]):
    """Queue a turn, admit it, and finish it with ``generated`` (its whole budget) in one chunk."""
    request = scheduler.new_request(session_id, prompt, SamplingParams(max_new_tokens=len(generated)))
    scheduler.enqueue(request)
    admitted = scheduler.admit()
    calls = scheduler.prefill_rows(admitted, version=1)
    running = scheduler.running()
    rows = scheduler.decode_row_count(len(running))
    layout, _ = scheduler.decode_rows(running, rows)
    tokens = np.zeros((rows, len(generated)), np.int32)
    produced = np.zeros(rows, np.int32)
    for row, slot in zip(layout, running, strict=True):
        if slot.request is request:
            tokens[row], produced[row] = generated, len(generated)
    finished = scheduler.record_chunk(
        running, layout, tokens, np.zeros(tokens.shape, np.float32), produced, version=1
    )
    assert finished == [request] and request.stop_reason == "length"
    return calls


def test_the_least_recently_used_idle_session_loses_its_slot_first():
    scheduler = _scheduler()
    _turn(scheduler, "a", [1, 2, 3], [4])
    _turn(scheduler, "b", [5, 6], [7])
    _turn(scheduler, "a", [1, 2, 3, 4, 8], [9])  # a's second turn: b is now the older one

    _turn(scheduler, "c", [10, 11], [12])
    assert scheduler.counters["evictions"] == 1
    assert scheduler.cached_length("b") == 0
    assert scheduler.cached_length("a") == 6 and scheduler.cached_length("c") == 3


def test_a_cached_prompt_still_prefills_its_last_token():
    scheduler = _scheduler()
    _turn(scheduler, "a", [1, 2, 3], [4])
    (call,) = _turn(scheduler, "a", [1, 2, 3, 4], [5])
    assert (call.starts[0], call.last_index[0]) == (3, 0)
    assert call.tokens[0, 0] == 4
    assert scheduler.counters["reused_tokens"] == 3


def test_a_window_that_would_run_past_the_cache_slides_left_over_cached_tokens():
    scheduler = _scheduler(prefill_buckets=(16,))
    history = list(range(1, 28))
    _turn(scheduler, "a", history, [28])
    before = scheduler.counters["prefill_tokens"]
    # Two new tokens need a 16-token window; starting at slot 28 it would pass the cache's
    # 33 slots (32 and the scratch slot), so it starts at 17 and re-encodes 11 cached tokens.
    (call,) = _turn(scheduler, "a", [*history, 28, 29, 30], [31])
    assert call.starts[0] == 33 - 16
    assert call.tokens[0].tolist() == list(range(18, 31)) + [0, 0, 0]
    assert call.last_index[0] == 29 - 17
    assert scheduler.counters["prefill_tokens"] - before == 30 - 17


def test_prefill_groups_pad_rows_at_most_twofold_else_fill_the_largest_bucket():
    scheduler = _scheduler(num_slots=16, row_buckets=(1, 4, 16))
    assert scheduler._row_group(3) == 3  # padded to 4
    assert scheduler._row_group(7) == 4  # 16 rows for 7 would more than double the work
    assert scheduler._row_group(9) == 9


def test_a_prompt_continuing_a_newcomers_prefix_is_prefilled_after_it_from_its_row():
    scheduler = _scheduler(num_slots=3, max_seq_len=64, prefill_buckets=(16, 32, 64))
    shared, other = list(range(1, 31)), list(range(40, 60))
    requests = [
        scheduler.new_request(None, prompt, SamplingParams(max_new_tokens=1))
        for prompt in (shared + [31, 32], other, shared + [33])
    ]
    for request in requests:
        scheduler.enqueue(request)
    first, second = scheduler.prefill_rows(scheduler.admit(), version=1)
    # Wave one: the two fresh prompts, in full, each from its own row (a third row pads the call).
    assert (first.indices.tolist(), first.sources.tolist()) == ([0, 1, 3], [0, 1, 3])
    assert first.starts.tolist()[:2] == [0, 0]
    # Wave two: the third continues row 0's 30 tokens, copied along, and prefills one.
    assert (second.indices.tolist(), second.sources.tolist(), second.starts.tolist()) == (
        [2], [0], [30]
    )
    assert second.tokens[0, 0] == 33 and second.last_index[0] == 0
    assert scheduler.counters["shared_tokens"] == 30


def test_a_shared_prefix_that_would_not_shrink_the_prefill_window_is_not_copied():
    scheduler = _scheduler(num_slots=2, max_seq_len=64, prefill_buckets=(16, 32, 64))
    _turn(scheduler, "a", list(range(1, 21)), [21])
    # Two shared tokens leave 14 of 16 to prefill: the same 16-token window, so no copy.
    (call,) = _turn(scheduler, "b", [1, 2, *range(70, 84)], [84])
    assert (call.sources[0], call.starts[0]) == (call.indices[0], 0)
    assert scheduler.counters["shared_tokens"] == 0


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"temperature": 0.0}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"stop": ("",)}, "stop"),
        ({"stop": "</tool>"}, "stop"),
    ],
)
def test_sampling_params_out_of_range_are_refused_naming_the_field(fields, named):
    with pytest.raises(ValueError, match=named):
        SamplingParams(**({"max_new_tokens": 4} | fields))


def test_sampling_params_are_normalised_once():
    sampling = SamplingParams(max_new_tokens=4, stop=["</tool>"], seed=-1)
    assert sampling.stop == ("</tool>",)
    assert sampling.seed == 0x7FFFFFFF  # the low 31 bits the kernels take
    with pytest.raises(ValueError, match="detokenize"):
        _scheduler().new_request(None, [1, 2], sampling)
