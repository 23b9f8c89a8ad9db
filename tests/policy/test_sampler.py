"""The batch sampler against full forward passes: log-probs, independent rows, EOS, no recompiles.

Tolerances: see tests/policy/sampling_reference.py.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from policy.engine import SamplingParams
from policy.model import split_model
from policy.sampler import Sampler
from policy.tokenizer import BOS_ID, EOS_ID, PAD_ID
from tests.policy.sampling_reference import (
    CHUNK,
    CONFIG,
    TOLERANCE,
    random_tokens,
    token_logprobs,
)


@pytest.fixture(scope="module")
def sampler(model) -> Sampler:
    return Sampler(
        split_model(model)[0],
        config=CONFIG,
        eos_id=EOS_ID,
        pad_id=PAD_ID,
        batch_buckets=(1, 4),
        chunk_size=CHUNK,
    )


def test_sampler_logprobs_match_a_full_forward_pass_of_each_completion(
    sampler, params, forward_logprobs
):
    temperature = 0.7
    # More prompts than slots: later ones are admitted as earlier rows finish.
    prompts = [random_tokens(60 + n, length) for n, length in enumerate([9, 3, 20, 14, 1, 30])]
    completions = sampler.generate(
        params, prompts, SamplingParams(max_new_tokens=12, temperature=temperature, seed=0)
    )
    assert len(completions) == len(prompts)
    for prompt, completion in zip(prompts, completions, strict=True):
        assert completion.finished == (EOS_ID in completion.token_ids)
        if not completion.finished:
            assert len(completion.token_ids) == 12
        sequence = prompt + completion.token_ids
        reference = token_logprobs(forward_logprobs(params, sequence, temperature), sequence)
        np.testing.assert_allclose(
            completion.logprobs, reference[len(prompt) - 1 :], atol=TOLERANCE
        )


def test_a_row_does_not_depend_on_the_other_prompts_in_its_batch(sampler, params):
    prompt = random_tokens(70, 6)
    alone = sampler.generate(
        params, [prompt], SamplingParams(max_new_tokens=10, temperature=1e-4, seed=3)
    )[0]
    crowded = sampler.generate(
        params,
        [random_tokens(71, 30), prompt, random_tokens(72, 2)],
        SamplingParams(max_new_tokens=10, temperature=1e-4, seed=4),
    )[1]
    assert crowded.token_ids == alone.token_ids


def test_sampler_generation_stops_at_eos_and_keeps_it(model, params):
    graphdef = split_model(model)[0]
    prompts = [random_tokens(73, 4), random_tokens(74, 7)]
    probe = Sampler(graphdef, config=CONFIG, eos_id=-1, pad_id=PAD_ID, batch_buckets=(4,))
    greedy_sampling = SamplingParams(max_new_tokens=16, temperature=1.0, top_k=1, seed=0)
    greedy = probe.generate(params, prompts, greedy_sampling)

    # Declare the first token that row 0 generates for the first time at step >= 1 the EOS.
    first_tokens = greedy[0].token_ids
    stop = next((i for i in range(1, 16) if first_tokens[i] not in first_tokens[:i]), 0)
    eos_id = first_tokens[stop]
    sampler = Sampler(graphdef, config=CONFIG, eos_id=eos_id, pad_id=PAD_ID, batch_buckets=(4,))
    completions = sampler.generate(params, prompts, greedy_sampling)

    assert completions[0].token_ids == first_tokens[: stop + 1]
    assert completions[0].finished and completions[0].stop_reason == "eos"
    other = greedy[1].token_ids
    expected = other[: other.index(eos_id) + 1] if eos_id in other else other
    assert completions[1].token_ids == expected


def test_sampler_new_weights_do_not_recompile_and_bad_prompts_are_refused(sampler, params):
    prompts = [random_tokens(75, 5)]
    sampler.generate(params, prompts, SamplingParams(max_new_tokens=4, temperature=1.0, seed=0))
    warm = sampler.compile_count
    sampler.generate(
        jax.tree.map(lambda leaf: leaf * 1.01, params),
        prompts,
        SamplingParams(max_new_tokens=4, temperature=1.0, seed=0),
    )
    assert sampler.compile_count == warm
    with pytest.raises(ValueError, match=r"prompt 1: .*max_seq_len=64"):
        sampler.generate(
            params, [[BOS_ID], random_tokens(76, 60)], SamplingParams(max_new_tokens=5)
        )
    with pytest.raises(ValueError, match="empty"):
        sampler.generate(params, [[]], SamplingParams(max_new_tokens=5, temperature=1.0, seed=0))
    # The refused call left nothing queued behind.
    assert sampler.generate(params, prompts, SamplingParams(max_new_tokens=2, temperature=1.0, seed=0))
