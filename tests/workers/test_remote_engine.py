"""Turns generated on a real vLLM server (`make vllm`, SmolLM2-135M) through workers/remote_engine.py.

Token ids in, token ids and log-probs out, the run's sampling parameters applied, and a dead
server's turns going to the live one."""

from __future__ import annotations

import asyncio
import socket
import subprocess

import httpx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from policy import SamplingParams, create_model, load_tokenizer, split_model
from tandem.configs.model import ModelConfig
from tests.polling import poll_until
from workers.inference_server import server_command, server_environment, vllm_python
from workers.remote_engine import RemoteBackendUnavailable, RemoteEngine, RemoteRequestRefused
from workers.remote_weights import load_version, server_version, write_version

SERVED = "policy"
MAX_MODEL_LEN = 512
# Loading the model and compiling vLLM's CPU kernels: a bound for a stuck server, not a measure of speed.
SERVER_READY_S = 480
# What the server's log-probs may differ from the trainer's forward pass by, per token (measured: 3e-5).
LOGPROB_TOLERANCE = 1e-3


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_server(smollm2, tmp_path_factory):
    if not vllm_python().is_file():
        pytest.fail(f"{vllm_python()} is missing: run `make vllm` (make test does)")
    port = _free_port()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    command = server_command(model_dir=str(smollm2), weights_dir=log.parent / "version-0", served_name=SERVED,
                             host="127.0.0.1", port=port, max_model_len=MAX_MODEL_LEN)
    with open(log, "wb") as output:
        server = subprocess.Popen(command, env=server_environment(kv_cache_gib=1), stdout=output,
                                  stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def died() -> None:
        if server.poll() is not None:
            pytest.fail(f"the vLLM server exited with {server.returncode}: {log.read_text()[-3000:]}")

    try:
        poll_until(lambda: httpx.get(f"{url}/v1/models", timeout=2).status_code == 200, timeout_s=SERVER_READY_S,
                   interval_s=1.0, between=died, ignoring=(httpx.HTTPError,),
                   what=lambda: f"the vLLM server: {log.read_text()[-2000:]}")
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    return load_tokenizer(str(smollm2))


@pytest.fixture(scope="module")
def chat_prompt(tokenizer) -> list[int]:
    # SmolLM2's chat template, as producers render a first turn: system, user, then the assistant's header.
    text = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n")
    return tokenizer.encode(text)


def _engine(*urls: str, **settings) -> RemoteEngine:
    return RemoteEngine(list(urls), model=SERVED, end_of_turn_id=2, **settings)  # SmolLM2's <|im_end|>


def _generate(engine: RemoteEngine, prompt: list[int], **params):
    return asyncio.run(engine.generate(None, prompt, SamplingParams(**params)))


def test_the_sampled_tokens_and_log_probs_are_the_servers_and_match_the_trainers_forward_pass(
        vllm_server, chat_prompt, smollm2):
    engine = _engine(vllm_server)
    turns = {temperature: _generate(engine, chat_prompt, max_new_tokens=24, temperature=temperature, seed=7)
             for temperature in (1.0, 0.7)}

    config = ModelConfig(hf_checkpoint=str(smollm2), tokenizer=str(smollm2), max_seq_len=MAX_MODEL_LEN)
    model = create_model(config, vocab_size=load_tokenizer(str(smollm2)).vocab_size, rngs=None)
    for temperature, turn in turns.items():
        assert len(turn.token_ids) == len(turn.logprobs) > 0
        assert _server_logprobs_match(model, chat_prompt, turn, temperature=temperature) < LOGPROB_TOLERANCE, turn


def test_the_runs_sampling_parameters_apply_and_each_turn_ends_with_its_reason(vllm_server, chat_prompt, tokenizer):
    engine = _engine(vllm_server)

    greedy = [_generate(engine, chat_prompt, max_new_tokens=16, top_k=1, seed=seed) for seed in (1, 2)]
    assert greedy[0].token_ids == greedy[1].token_ids  # top_k=1 is greedy, whatever the seed
    seeded = [_generate(engine, chat_prompt, max_new_tokens=16, temperature=1.0, seed=11) for _ in range(2)]
    assert seeded[0].token_ids == seeded[1].token_ids  # the seed fixes a sampled turn

    cut = _generate(engine, chat_prompt, max_new_tokens=3, top_k=1)
    assert (cut.stop_reason, cut.finished, len(cut.token_ids)) == ("length", False, 3)

    whole = _generate(engine, chat_prompt, max_new_tokens=200, top_k=1)
    assert whole.stop_reason == "eos" and whole.finished and whole.token_ids[-1] == 2  # kept, as the engine keeps it

    text = tokenizer.decode(whole.token_ids)
    stop = text.split()[1]  # the second word of the greedy answer ends the turn there
    stopped = _generate(engine, chat_prompt, max_new_tokens=200, top_k=1, stop=(stop,))
    assert stopped.stop_reason == "stop" and stopped.finished
    assert tokenizer.decode(stopped.token_ids).rstrip().endswith(stop)  # the stop text is kept
    assert len(stopped.token_ids) < len(whole.token_ids)


def test_a_dead_servers_turns_go_to_the_live_one_and_it_leaves_rotation_with_its_reason(vllm_server, chat_prompt):
    dead = f"http://127.0.0.1:{_free_port()}"
    engine = _engine(dead, vllm_server, retry_after_s=3600)

    turns = [_generate(engine, chat_prompt, max_new_tokens=4, top_k=1) for _ in range(3)]

    assert all(len(turn.token_ids) == 4 for turn in turns)
    states = {state["url"]: state for state in engine.server_states()}
    assert states[dead]["available"] is False and "ClientConnectorError" in states[dead]["reason"]
    assert states[vllm_server]["available"] is True
    assert engine.stats.requests == 3 and engine.stats.retried_requests == 1  # only the first tried the dead one

    with pytest.raises(RemoteBackendUnavailable, match="no inference server could take the turn") as raised:
        _generate(_engine(dead), chat_prompt, max_new_tokens=4)
    assert dead in str(raised.value)


def test_a_turn_the_server_refuses_fails_alone_and_the_server_stays_in_rotation(vllm_server, chat_prompt):
    engine = _engine(vllm_server)

    with pytest.raises(RemoteRequestRefused, match="HTTP 400"):
        _generate(engine, chat_prompt * 40, max_new_tokens=4)  # longer than the server's max-model-len

    assert engine.server_states()[0]["available"] is True
    assert len(_generate(engine, chat_prompt, max_new_tokens=4, top_k=1).token_ids) == 4


def _server_logprobs_match(model, prompt: list[int], turn, *, temperature: float) -> float:
    """The largest difference between the turn's log-probs and ``model``'s forward pass over it."""
    tokens = jnp.array([prompt + turn.token_ids])
    length = tokens.shape[1]
    logits = model(tokens, jnp.arange(length)[None, :], jnp.ones((1, length), dtype=bool))[0]
    logprobs = jax.nn.log_softmax(logits / temperature, axis=-1)
    start = len(prompt) - 1
    ours = np.array([float(logprobs[start + index, token]) for index, token in enumerate(turn.token_ids)])
    return float(np.abs(ours - np.array(turn.logprobs)).max())


def test_a_new_version_is_loaded_in_place_and_the_server_then_samples_from_it(vllm_server, chat_prompt, smollm2,
                                                                             tmp_path):
    config = ModelConfig(hf_checkpoint=str(smollm2), tokenizer=str(smollm2), max_seq_len=MAX_MODEL_LEN)
    imported = create_model(config, vocab_size=load_tokenizer(str(smollm2)).vocab_size, rngs=None)
    graphdef, params = split_model(imported)
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(0), len(leaves))
    # Every weight moved by a few percent of its own scale: a version the imported model's log-probs do not match.
    trained = jax.tree.unflatten(tree, [leaf + 0.05 * jnp.std(leaf) * jax.random.normal(key, leaf.shape, leaf.dtype)
                                        for leaf, key in zip(leaves, keys, strict=True)])
    directory = write_version(graphdef, trained, tmp_path / "version-1")
    engine = _engine(vllm_server)

    try:
        paused_s = asyncio.run(load_version(vllm_server, directory=directory, version=1))
        assert paused_s > 0
        assert asyncio.run(server_version(vllm_server)) == 1
        turn = _generate(engine, chat_prompt, max_new_tokens=24, temperature=1.0, seed=3)
        assert _server_logprobs_match(nnx.merge(graphdef, trained), chat_prompt, turn, temperature=1.0) < LOGPROB_TOLERANCE
        assert _server_logprobs_match(imported, chat_prompt, turn, temperature=1.0) > 10 * LOGPROB_TOLERANCE
    finally:
        # The imported weights back, for the module's other tests.
        asyncio.run(load_version(vllm_server, directory=write_version(graphdef, params, tmp_path / "version-0"),
                                 version=0))
    assert asyncio.run(server_version(vllm_server)) == 0
    again = _generate(engine, chat_prompt, max_new_tokens=24, temperature=1.0, seed=3)
    assert _server_logprobs_match(imported, chat_prompt, again, temperature=1.0) < LOGPROB_TOLERANCE
