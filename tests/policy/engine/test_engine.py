"""The inference engine against full forward passes: prefix reuse, continuous batching, threads, weights.

Tolerances: see tests/policy/sampling_reference.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import jax
import numpy as np
import pytest
from flax import nnx

from policy.engine import Completion, InferenceEngine, SamplingParams, sample_tokens
from policy.model import Transformer, split_model
from policy.tokenizer import BOS_ID, PAD_ID, ByteTokenizer
from tests.policy.factories import random_model
from tests.policy.sampling_reference import (
    CHUNK,
    CONFIG,
    NUM_SLOTS,
    TOLERANCE,
    full_forward_logprobs,
    random_tokens,
    token_logprobs,
)


@pytest.fixture(scope="module")
def engine(model, params):
    """One warmed-up engine shared by the module, driven step by step (no thread).

    It has no EOS (``eos_id=-1``), so every turn runs to ``max_new_tokens`` or
    a stop string and tests control lengths exactly; tests/policy/test_sampler.py covers EOS.

    ``warm_traces`` records its trace counts right after warm-up: the
    recompilation test checks them after the other tests ran their workloads.
    """
    engine = InferenceEngine(
        split_model(model)[0],
        config=CONFIG,
        eos_id=-1,
        pad_id=PAD_ID,
        num_slots=NUM_SLOTS,
        chunk_size=CHUNK,
        detokenize=ByteTokenizer().decode,
        background=False,
    )
    engine.set_params(params, version=1)
    engine.warmup()
    engine.warm_traces = engine.trace_counts
    yield engine
    engine.close()


def _run(engine: InferenceEngine, session_id, prompt, **sampling) -> Completion:
    future = engine.submit(session_id, prompt, SamplingParams(**sampling))
    engine.run_until([future])
    return future.result()


# ---------------------------------------------------------------- sampling in chunks


def test_each_token_is_drawn_with_its_own_key_across_chunk_boundaries(
    engine, params, forward_logprobs
):
    # A chunk draws the random numbers of all its steps before decoding; the tokens must
    # still be those drawn one at a time with fold_in(key(seed), n) from each tempered
    # distribution, in every chunk of the turn.
    prompt = random_tokens(21, 9)
    seed, temperature = 1234, 0.8
    completion = _run(
        engine, None, prompt, max_new_tokens=3 * CHUNK + 1, temperature=temperature, seed=seed
    )
    log_probs = forward_logprobs(params, prompt + completion.token_ids, temperature)
    draw = jax.jit(sample_tokens)
    expected = [
        int(draw(log_probs[row][None], np.ones(1, np.float32), np.ones(1, np.float32),
                 np.zeros(1, np.int32), jax.random.fold_in(jax.random.key(seed), n)[None])[0][0])
        for n, row in enumerate(range(len(prompt) - 1, len(prompt) - 1 + len(completion.token_ids)))
    ]
    assert completion.token_ids == expected


# ---------------------------------------------------------------- engine vs the full forward


def test_multi_turn_logprobs_match_a_full_forward_pass_of_the_final_sequence(
    engine, params, forward_logprobs
):
    temperature = 0.7
    conversation = random_tokens(1, 10)
    policy_spans = []
    for turn in range(3):
        completion = _run(
            engine,
            "multi-turn",
            conversation,
            max_new_tokens=10,
            temperature=temperature,
            seed=turn,
        )
        assert len(completion.token_ids) == len(completion.logprobs)
        policy_spans.append((len(conversation), completion))
        conversation = conversation + completion.token_ids + random_tokens(10 + turn, 5)[1:]
    engine.end_session("multi-turn")

    reference = token_logprobs(forward_logprobs(params, conversation, temperature), conversation)
    for start, completion in policy_spans:
        np.testing.assert_allclose(
            completion.logprobs,
            reference[start - 1 : start - 1 + len(completion.token_ids)],
            atol=TOLERANCE,
        )


def test_a_model_with_sliding_window_layers_decodes_as_its_full_forward_pass():
    # Gemma 3's layout at toy size: a window of 5 tokens, far shorter than the conversation,
    # so a cached decode, a prefill extending a session or a chunk that saw past it would miss.
    config = dataclasses.replace(
        CONFIG, layer_attention=("sliding", "full"), sliding_window=5, sliding_rope_theta=100.0,
        qk_norm=True, post_sublayer_norms=True, scale_embeddings=True, mlp_activation="gelu_tanh")
    model = random_model(config, 7)
    graphdef, params = split_model(model)
    engine = InferenceEngine(graphdef, config=config, eos_id=-1, pad_id=PAD_ID, num_slots=NUM_SLOTS,
                             chunk_size=CHUNK, detokenize=ByteTokenizer().decode, background=False)
    try:
        engine.set_params(params, version=1)
        conversation, spans = random_tokens(3, 12), []
        for turn in range(3):
            completion = _run(engine, "sliding", conversation, max_new_tokens=9, temperature=0.7, seed=turn)
            spans.append((len(conversation), completion))
            conversation = conversation + completion.token_ids + random_tokens(20 + turn, 6)[1:]
    finally:
        engine.close()
    reference = token_logprobs(full_forward_logprobs(model)(params, conversation, 0.7), conversation)
    for start, completion in spans:
        np.testing.assert_allclose(
            completion.logprobs, reference[start - 1 : start - 1 + len(completion.token_ids)], atol=TOLERANCE)


def test_the_next_turn_prefills_only_the_new_tokens_and_matches_a_full_re_encode(engine):
    prompt = random_tokens(2, 12)
    first = _run(engine, "reuse", prompt, max_new_tokens=8, temperature=1.0, seed=0)
    observation = random_tokens(3, 6)[1:]
    second_prompt = prompt + first.token_ids + observation

    before = engine.stats
    reused = _run(engine, "reuse", second_prompt, max_new_tokens=8, temperature=1.0, seed=1)
    after = engine.stats
    assert after.prefill_tokens - before.prefill_tokens == len(observation)
    assert after.reused_tokens - before.reused_tokens == len(second_prompt) - len(observation)

    # A fresh session with the same prompt copies the cached prefix from the other slot.
    shared = _run(engine, "shared", second_prompt, max_new_tokens=8, temperature=1.0, seed=1)
    assert engine.stats.shared_tokens - after.shared_tokens == len(second_prompt) - 1
    assert engine.stats.prefill_tokens - after.prefill_tokens == 1
    engine.end_session("reuse")
    engine.end_session("shared")

    # With no slot holding it, the turn is prefilled in full, and samples the same tokens.
    before_full = engine.stats
    re_encoded = _run(engine, "re-encode", second_prompt, max_new_tokens=8, temperature=1.0, seed=1)
    assert engine.stats.prefill_tokens - before_full.prefill_tokens == len(second_prompt)
    assert engine.stats.shared_tokens == before_full.shared_tokens
    for completion in (reused, shared):
        assert completion.token_ids == re_encoded.token_ids
        np.testing.assert_allclose(completion.logprobs, re_encoded.logprobs, atol=TOLERANCE)
    engine.end_session("re-encode")


def test_prompts_sharing_a_prefix_prefill_it_once_and_match_a_full_forward_pass(
    engine, params, forward_logprobs
):
    # A GRPO group, or episodes behind one system message: one prompt start, admitted together.
    prefix = random_tokens(50, 40)
    prompts = [prefix + random_tokens(51 + index, 4)[1:] for index in range(NUM_SLOTS)]
    before = engine.stats
    futures = [
        engine.submit(None, prompt, SamplingParams(max_new_tokens=6, temperature=0.9, seed=index))
        for index, prompt in enumerate(prompts)
    ]
    engine.run_until(futures)
    after = engine.stats
    # The first prompt is prefilled whole; the others copy its 40 tokens and prefill 3 each.
    assert after.shared_tokens - before.shared_tokens == (NUM_SLOTS - 1) * len(prefix)
    assert after.prefill_tokens - before.prefill_tokens == len(prompts[0]) + (NUM_SLOTS - 1) * 3
    for prompt, future in zip(prompts, futures, strict=True):
        sequence = prompt + future.result().token_ids
        reference = token_logprobs(forward_logprobs(params, sequence, 0.9), sequence)
        np.testing.assert_allclose(
            future.result().logprobs, reference[len(prompt) - 1 :], atol=TOLERANCE
        )


def test_a_new_session_never_continues_a_prefix_computed_by_older_weights(
    engine, params, forward_logprobs
):
    scaled = jax.tree.map(lambda leaf: leaf * 1.05, params)
    prompt = random_tokens(60, 40)
    engine.set_params(params, version=1)
    _run(engine, "older", prompt, max_new_tokens=2, seed=0)
    engine.set_params(scaled, version=2)

    before = engine.stats
    newer = _run(engine, "newer", prompt, max_new_tokens=4, temperature=1.0, seed=1)
    assert engine.stats.shared_tokens == before.shared_tokens
    assert engine.stats.prefill_tokens - before.prefill_tokens == len(prompt)
    sequence = prompt + newer.token_ids
    reference = token_logprobs(forward_logprobs(scaled, sequence, 1.0), sequence)
    np.testing.assert_allclose(newer.logprobs, reference[len(prompt) - 1 :], atol=TOLERANCE)

    # The prefix the new weights computed is shared.
    _run(engine, "newest", prompt, max_new_tokens=2, seed=2)
    assert engine.stats.shared_tokens - before.shared_tokens == len(prompt) - 1
    engine.set_params(params, version=1)
    for session in ("older", "newer", "newest"):
        engine.end_session(session)


def test_a_prompt_that_does_not_extend_the_cache_is_re_encoded_from_where_it_diverges(
    engine, params, forward_logprobs
):
    prompt = random_tokens(4, 16)
    _run(engine, "diverge", prompt, max_new_tokens=6, temperature=1.0, seed=0)
    edited = prompt[:9] + random_tokens(5, 8)[1:]  # a rewritten history
    before = engine.stats.prefill_tokens
    completion = _run(engine, "diverge", edited, max_new_tokens=6, temperature=1.0, seed=0)
    assert engine.stats.prefill_tokens - before == len(edited) - 9
    reference = token_logprobs(
        forward_logprobs(params, edited + completion.token_ids, 1.0), edited + completion.token_ids
    )
    np.testing.assert_allclose(completion.logprobs, reference[len(edited) - 1 :], atol=TOLERANCE)
    engine.end_session("diverge")


def test_evicted_sessions_fall_back_to_a_full_prefill(engine, params, forward_logprobs):
    prompts = {f"lru-{n}": random_tokens(20 + n, 8) for n in range(NUM_SLOTS + 1)}
    evictions = engine.stats.evictions
    first = {}
    for session, prompt in prompts.items():  # one more session than slots: lru-0 is evicted
        first[session] = _run(engine, session, prompt, max_new_tokens=4, temperature=1.0, seed=0)
    assert engine.stats.evictions > evictions

    history = prompts["lru-0"] + first["lru-0"].token_ids + [65, 66]
    before = engine.stats.prefill_tokens
    completion = _run(engine, "lru-0", history, max_new_tokens=4, temperature=1.0, seed=1)
    assert engine.stats.prefill_tokens - before == len(history)
    sequence = history + completion.token_ids
    reference = token_logprobs(forward_logprobs(params, sequence, 1.0), sequence)
    np.testing.assert_allclose(completion.logprobs, reference[len(history) - 1 :], atol=TOLERANCE)
    for session in prompts:
        engine.end_session(session)


def test_an_ended_session_frees_its_slot_without_an_eviction(engine):
    for n in range(NUM_SLOTS):
        _run(engine, f"end-{n}", random_tokens(30 + n, 5), max_new_tokens=2, seed=0)
    engine.end_session("end-0")
    evictions = engine.stats.evictions
    _run(engine, "end-new", random_tokens(40, 5), max_new_tokens=2, seed=0)
    assert engine.stats.evictions == evictions
    for session in ["end-new", *(f"end-{n}" for n in range(1, NUM_SLOTS))]:
        engine.end_session(session)


# ---------------------------------------------------------------- continuous batching


def test_a_short_request_returns_while_a_long_one_keeps_decoding(engine, params):
    long = engine.submit("long", random_tokens(6, 8), SamplingParams(max_new_tokens=40))
    short = engine.submit("short", random_tokens(7, 20), SamplingParams(max_new_tokens=3))
    engine.step()  # prefill both, one chunk of CHUNK tokens
    assert short.done() and not long.done()
    assert len(short.result().token_ids) == 3 and short.result().stop_reason == "length"

    # A newcomer joins the running batch between chunks and also leaves first.
    joiner = engine.submit("joiner", random_tokens(8, 4), SamplingParams(max_new_tokens=5, seed=0))
    engine.run_until([joiner])
    assert not long.done()
    engine.run_until([long])
    assert len(long.result().token_ids) == 40
    for session in ("long", "short", "joiner"):
        engine.end_session(session)


def test_a_chunk_decodes_only_the_busy_slots_and_matches_a_full_forward_pass(engine, params, forward_logprobs):
    """Sessions waiting on their environments keep their slots, and cost a decode chunk nothing."""
    sessions = [f"holder-{index}" for index in range(NUM_SLOTS)]
    prompts = [random_tokens(20 + index, 6) for index in range(NUM_SLOTS)]
    firsts = [engine.submit(session, prompt, SamplingParams(max_new_tokens=2, seed=0))
              for session, prompt in zip(sessions, prompts, strict=True)]
    engine.run_until(firsts)
    assert engine.session_count == NUM_SLOTS  # every slot holds a session
    for prompt, first in zip(prompts, firsts, strict=True):  # decoded in place, every row busy
        full = prompt + first.result().token_ids
        reference = token_logprobs(forward_logprobs(params, full, 1.0), full)
        np.testing.assert_allclose(first.result().logprobs, reference[len(prompt) - 1 :], atol=TOLERANCE)

    # Only the session in the highest slot takes its next turn.
    last = sessions[-1]
    conversation = prompts[-1] + firsts[-1].result().token_ids + random_tokens(30, 4)[1:]
    before = engine.stats
    completion = _run(engine, last, conversation, max_new_tokens=2 * CHUNK, temperature=0.8, seed=5)
    after = engine.stats
    chunks = after.decode_chunks - before.decode_chunks
    assert chunks == 2 and after.decode_rows - before.decode_rows == chunks  # one row each, not NUM_SLOTS
    assert after.evictions == before.evictions

    full = conversation + completion.token_ids
    reference = token_logprobs(forward_logprobs(params, full, 0.8), full)
    np.testing.assert_allclose(completion.logprobs, reference[len(conversation) - 1 :], atol=TOLERANCE)
    # The other sessions' cached prefixes survived the chunks that skipped them.
    for session, prompt, first in zip(sessions[:-1], prompts[:-1], firsts[:-1], strict=True):
        extended = prompt + first.result().token_ids + [65]
        reused_before = engine.stats.reused_tokens
        _run(engine, session, extended, max_new_tokens=1, seed=0)
        assert engine.stats.reused_tokens - reused_before == len(extended) - 1
    for session in sessions:
        engine.end_session(session)


@pytest.fixture(scope="module")
def threaded_engine(model, params):
    """An engine served by its background thread; ``hook[0]`` runs before every step."""
    hook = [lambda: None]
    engine = InferenceEngine(
        split_model(model)[0],
        config=CONFIG,
        eos_id=-1,
        pad_id=PAD_ID,
        num_slots=NUM_SLOTS,
        chunk_size=CHUNK,
        between_chunks=lambda: hook[0](),
    )
    engine.set_params(params, version=3)
    yield engine, hook
    engine.close()


def test_the_async_api_resolves_each_turn_as_soon_as_it_is_done(threaded_engine):
    """A background thread serves asyncio callers; the short turn does not wait for the long one."""
    engine, hook = threaded_engine
    release = threading.Event()
    turns: dict[str, object] = {}

    def hold_the_long_turn_until_the_short_one_was_seen() -> None:
        short = turns.get("short")
        if short is not None and short.done():
            release.wait(timeout=30)

    hook[0] = hold_the_long_turn_until_the_short_one_was_seen

    async def main():
        long = asyncio.ensure_future(
            engine.generate("long", random_tokens(9, 8), SamplingParams(max_new_tokens=30, seed=0))
        )
        turns["short"] = short_future = engine.submit(
            "short", random_tokens(10, 8), SamplingParams(max_new_tokens=2)
        )
        short = await asyncio.wrap_future(short_future)
        assert not long.done()
        release.set()
        return short, await long

    try:
        short, long = asyncio.run(main())
    finally:
        release.set()
        hook[0] = lambda: None
    assert len(short.token_ids) == 2 and len(long.token_ids) == 30
    assert short.policy_version == long.policy_version == 3
    engine.end_session("long")
    engine.end_session("short")


def test_cancelling_a_caller_stops_its_turn_at_the_next_chunk(threaded_engine):
    engine, hook = threaded_engine
    prompt = random_tokens(17, 8)
    cancelled = threading.Event()
    steps = []

    async def main():
        loop = asyncio.get_running_loop()
        turn = asyncio.ensure_future(
            engine.generate("cancelled", prompt, SamplingParams(max_new_tokens=40, seed=0))
        )

        def cancel_before_the_second_chunk() -> None:
            steps.append(None)
            if len(steps) == 2:
                loop.call_soon_threadsafe(turn.cancel)
                cancelled.wait(timeout=30)

        hook[0] = cancel_before_the_second_chunk
        with pytest.raises(asyncio.CancelledError):
            await turn
        cancelled.set()
        # Any later completion comes after the chunk boundary that dropped the cancelled turn.
        await engine.generate(None, [BOS_ID], SamplingParams(max_new_tokens=1))

    try:
        asyncio.run(main())
    finally:
        cancelled.set()
        hook[0] = lambda: None
    # The session keeps the two chunks it decoded, not the 40 tokens it asked for.
    assert engine.cached_length("cancelled") == len(prompt) + 2 * CHUNK
    engine.end_session("cancelled")
    assert engine.cached_length("cancelled") == 0


@pytest.mark.parametrize("hold_fraction", [0.0, 1.0])
def test_holding_chunks_for_refills_changes_no_turn(model, params, hold_fraction):
    """Multi-turn sessions whose next turn follows at once, so that the engine holds chunks for them
    (policy/engine/admission.py): every turn comes back, the same as the engine decodes it alone."""
    engine = InferenceEngine(split_model(model)[0], config=CONFIG, eos_id=-1, pad_id=PAD_ID, num_slots=NUM_SLOTS,
                             chunk_size=CHUNK, refill_hold_fraction=hold_fraction)
    engine.set_params(params, version=1)

    async def session(index: int) -> list[list[int]]:
        prompt, turns = random_tokens(40 + index, 6), []
        for turn in range(4):
            completion = await engine.generate(index, prompt, SamplingParams(max_new_tokens=3 + turn, seed=index))
            turns.append(completion.token_ids)
            prompt = prompt + completion.token_ids + random_tokens(50 + turn, 2)
        return turns

    async def sessions():
        return await asyncio.gather(*[session(index) for index in range(2 * NUM_SLOTS)])

    try:
        together = asyncio.run(sessions())
        alone = [asyncio.run(session(index)) for index in range(2 * NUM_SLOTS)]
    finally:
        engine.close()
    assert together == alone
    assert [len(turn) for turn in together[0]] == [3, 4, 5, 6]


# ---------------------------------------------------------------- sampling options


def test_top_k_one_and_a_tiny_top_p_are_greedy(engine, params, forward_logprobs):
    prompt = random_tokens(11, 9)
    for options in ({"top_k": 1}, {"top_p": 1e-6}):
        completion = _run(
            engine, None, prompt, max_new_tokens=12, temperature=1.0, seed=5, **options
        )
        sequence = prompt + completion.token_ids
        greedy = forward_logprobs(params, sequence, 1.0).argmax(axis=-1)
        assert completion.token_ids == greedy[len(prompt) - 1 :].tolist()


def test_top_k_samples_only_among_the_k_most_likely_tokens(engine, params, forward_logprobs):
    prompt = random_tokens(12, 6)
    completion = _run(engine, None, prompt, max_new_tokens=30, temperature=2.0, top_k=3, seed=0)
    sequence = prompt + completion.token_ids
    logprobs = forward_logprobs(params, sequence, 2.0)[len(prompt) - 1 :]
    for step, token in enumerate(completion.token_ids):
        assert token in np.argsort(-logprobs[step])[:3]
    # Recorded log-probs are the untruncated tempered ones (comparable with the trainer's).
    np.testing.assert_allclose(
        completion.logprobs, logprobs[np.arange(30), completion.token_ids], atol=TOLERANCE
    )


def test_stop_strings_truncate_right_after_the_stop_text(engine):
    decode = ByteTokenizer().decode
    prompt = random_tokens(13, 7)
    free = _run(engine, None, prompt, max_new_tokens=24, temperature=1.0, seed=2)
    # Stop at the first printable character the policy writes after its second token.
    position = next(i for i, t in enumerate(free.token_ids) if i >= 2 and 32 < t < 127)
    stop = chr(free.token_ids[position])
    keep = next(n for n in range(1, 25) if stop in decode(free.token_ids[:n]))

    stopped = _run(
        engine, "stop", prompt, max_new_tokens=24, temperature=1.0, seed=2, stop=["\x00never", stop]
    )
    assert stopped.token_ids == free.token_ids[:keep]
    assert stopped.logprobs == pytest.approx(free.logprobs[:keep], abs=TOLERANCE)
    assert stopped.stop_reason == "stop" and stopped.finished

    # The cut-off tail is not part of the session: the next turn reuses exactly what was kept.
    before = engine.stats.prefill_tokens
    _run(engine, "stop", prompt + stopped.token_ids + [10], max_new_tokens=2, seed=0)
    assert engine.stats.prefill_tokens - before == 1
    engine.end_session("stop")


# ---------------------------------------------------------------- weights and compilation


def test_new_weights_land_between_chunks_without_draining(engine, params):
    scaled = jax.tree.map(lambda leaf: leaf * 1.01, params)
    engine.set_params(params, version=1)
    running = engine.submit("swap", random_tokens(14, 6), SamplingParams(max_new_tokens=3 * CHUNK))
    engine.step()
    engine.set_params(scaled, version=2)
    assert engine.policy_version == 2
    newcomer = engine.submit("swap-new", random_tokens(15, 6), SamplingParams(max_new_tokens=2))
    engine.step()
    assert not running.done()  # still decoding, now with version 2
    engine.run_until([running, newcomer])

    assert len(running.result().token_ids) == 3 * CHUNK
    assert (running.result().policy_version, running.result().last_policy_version) == (1, 2)
    assert (newcomer.result().policy_version, newcomer.result().last_policy_version) == (2, 2)
    engine.set_params(params, version=1)
    engine.end_session("swap")
    engine.end_session("swap-new")


def test_nothing_recompiles_after_warm_up(engine, params):
    # Every other test of this module ran on the engine before or after this one;
    # this one adds sessions at every prompt bucket, full slots, and new weights.
    engine.set_params(jax.tree.map(lambda leaf: leaf * 0.99, params), version=9)
    futures = [
        engine.submit(
            f"warm-{n}",
            random_tokens(50 + n, length),
            SamplingParams(
                max_new_tokens=new, temperature=temperature, top_p=top_p, top_k=top_k, seed=n
            ),
        )
        for n, (length, new, temperature, top_p, top_k) in enumerate(
            [
                (3, 5, 1.0, 1.0, 0),
                (20, 9, 0.5, 0.9, 0),
                (40, 20, 2.0, 1.0, 7),
                (55, 9, 1.0, 0.5, 3),
                (1, 1, 1.0, 1.0, 0),
                (33, 3, 0.8, 1.0, 0),
            ]
        )
    ]
    engine.run_until(futures)
    engine.set_params(params, version=1)
    for n in range(len(futures)):
        engine.end_session(f"warm-{n}")
    assert engine.trace_counts == engine.warm_traces


def test_an_engine_of_the_same_shape_compiles_nothing_again(engine, params):
    """A worker's runtime for the next run of the same model reuses every compiled bucket."""
    same_model = Transformer(CONFIG, rngs=nnx.Rngs(3))  # another run: same shapes, other weights

    def build(num_slots: int) -> InferenceEngine:
        built = InferenceEngine(split_model(same_model)[0], config=CONFIG, eos_id=-1, pad_id=PAD_ID,
                                num_slots=num_slots, chunk_size=CHUNK, background=False)
        built.set_params(params, version=1)
        return built

    twin = build(NUM_SLOTS)
    traces_before = twin.trace_counts
    twin.warmup()
    completion = _run(twin, None, random_tokens(7, 10), max_new_tokens=6)
    twin.close()
    assert len(completion.token_ids) == 6
    assert twin.trace_counts == traces_before
    assert sum(traces_before.values()) > 0

    wider = build(NUM_SLOTS + 1)  # another shape compiles its own buckets
    wider.warmup()
    wider.close()
    assert wider.trace_counts["decode"] == len(wider._scheduler.row_buckets)


def test_requests_that_do_not_fit_are_refused(engine):
    with pytest.raises(ValueError, match="max_seq_len=64"):
        engine.submit(None, random_tokens(16, 60), SamplingParams(max_new_tokens=5))
    with pytest.raises(ValueError, match="empty"):
        engine.submit(None, [], SamplingParams(max_new_tokens=5))
    engine.submit("busy", [BOS_ID], SamplingParams(max_new_tokens=1))
    with pytest.raises(ValueError, match="in flight"):
        engine.submit("busy", [BOS_ID], SamplingParams(max_new_tokens=1))
    while engine.step():
        pass
    engine.end_session("busy")
