"""Hugging Face checkpoints: our logits against ``transformers``' PyTorch models.

Tiny random Llama 3 (llama3 rope scaling), Qwen2 (QKV bias), Qwen3
(QK-norm, explicit head_dim, tied embeddings) and Gemma 3 (sliding-window layers
with their own rotary base, a window far shorter than the rows, norms after each
sublayer stored as ``weight - 1``, GeGLU, scaled embeddings, a query scale apart
from head_dim) models are built with
``transformers``, their weights re-drawn at unit scale (the default init,
std 0.02, makes attention nearly uniform and would hide rotary or bias
mistakes), saved with ``save_pretrained`` and loaded with
:func:`policy.hf.load_hf_checkpoint`.

Tolerances, on logits of magnitude ~1-5:
- float32: absolute 1e-4 (measured 3e-6 to 5e-6; the two sides sum in different orders).
- bfloat16 parameters: our bfloat16 model must be within 2x (+0.02) of the
  error that ``transformers``' own bfloat16 model makes against its float32
  model (measured: ours 0.08-0.11, theirs 0.08-0.34, by family); bfloat16
  keeps 8 bits of mantissa, so only such a relative statement is meaningful.
"""

from __future__ import annotations

import dataclasses
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

# The reference implementations come from the `parity` extra, which `make test` installs;
# a missing one is an error, never a skip.
import torch  # noqa: E402
import transformers  # noqa: E402
from flax import nnx
from safetensors.numpy import load_file, save_file  # noqa: E402

from policy.factory import create_model  # noqa: E402
from policy.hf import (  # noqa: E402
    CheckpointError,
    export_hf_checkpoint,
    load_hf_checkpoint,
    load_hf_config,
)
from policy.model import Transformer, TransformerConfig, split_model  # noqa: E402
from tandem.configs.model import ModelConfig  # noqa: E402
from tests.policy.factories import forward, random_model  # noqa: E402

FLOAT32_TOLERANCE = 1e-4
VOCAB = 128
GEMMA_WINDOW = 6  # far below the rows' 24 tokens, so a query that saw past it would show
LENGTHS = (24, 15, 5)  # real tokens per row; rows are right-padded to the longest

COMMON = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=VOCAB,
)


def _hf_config(family: str):
    if family == "llama":
        return transformers.LlamaConfig(
            **COMMON,
            rope_theta=500_000.0,
            # original_max_position_embeddings below the test length, so scaling matters.
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
            rms_norm_eps=1e-5,
        )
    if family == "qwen2":
        return transformers.Qwen2Config(**COMMON, rope_theta=1_000_000.0)
    if family == "qwen3":
        return transformers.Qwen3Config(**COMMON, head_dim=32, tie_word_embeddings=True)
    if family == "gemma3":
        return transformers.Gemma3TextConfig(
            **COMMON, head_dim=32, query_pre_attn_scalar=24, sliding_window=GEMMA_WINDOW,
            layer_types=["sliding_attention", "full_attention"],
            rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
        )
    raise ValueError(family)


def _randomize(model, seed: int) -> None:
    """Unit-scale weights: attention peaky enough that rotary and bias mistakes show."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if name.endswith("norm.weight"):
                # Gemma's norms scale by 1 + weight: the same unit scale, stored as Gemma stores it.
                offset = 0.0 if isinstance(model, transformers.Gemma3ForCausalLM) else 1.0
                parameter.copy_(offset + 0.2 * noise)
            elif parameter.ndim == 1:  # QKV biases
                parameter.copy_(0.5 * noise)
            else:
                gain = 2.0 if ("q_proj" in name or "k_proj" in name) else 1.0
                parameter.copy_(gain * noise / math.sqrt(parameter.shape[-1]))


def _torch_model(family: str, seed: int = 0):
    config = _hf_config(family)
    config._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    _randomize(model, seed)
    return model


def _batch(seed: int = 0):
    rng = np.random.default_rng(seed)
    width = max(LENGTHS)
    tokens = rng.integers(0, VOCAB, (len(LENGTHS), width)).astype(np.int32)
    mask = np.arange(width)[None, :] < np.asarray(LENGTHS)[:, None]
    tokens = np.where(mask, tokens, 0)
    positions = np.broadcast_to(np.arange(width, dtype=np.int32), tokens.shape)
    return tokens, positions, mask


def _torch_logits(model, tokens, mask) -> np.ndarray:
    with torch.no_grad():
        logits = model(
            input_ids=torch.as_tensor(tokens, dtype=torch.long),
            attention_mask=torch.as_tensor(mask, dtype=torch.long),
        ).logits
    return logits.float().numpy()


def _our_logits(model: Transformer, tokens, positions, mask) -> np.ndarray:
    return np.asarray(forward(model, tokens, positions, mask))


def _max_error_on_real_positions(ours, reference, mask) -> float:
    return float(np.abs(ours - reference)[mask].max())


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """family -> (torch model, checkpoint directory); Llama is saved sharded."""
    saved = {}
    for family in ("llama", "qwen2", "qwen3", "gemma3"):
        model = _torch_model(family)
        directory = tmp_path_factory.mktemp(family)
        shard = {"max_shard_size": "40KB"} if family == "llama" else {}
        model.save_pretrained(directory, safe_serialization=True, **shard)
        saved[family] = (model, directory)
    return saved


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "gemma3"])
def test_loaded_checkpoint_gives_the_logits_of_transformers(checkpoints, family):
    torch_model, directory = checkpoints[family]
    model = load_hf_checkpoint(directory)
    tokens, positions, mask = _batch()
    error = _max_error_on_real_positions(
        _our_logits(model, tokens, positions, mask), _torch_logits(torch_model, tokens, mask), mask
    )
    assert error < FLOAT32_TOLERANCE, f"{family}: max |logit difference| {error:.2e}"


def test_the_llama_checkpoint_is_sharded_and_its_config_read(checkpoints):
    _, directory = checkpoints["llama"]
    assert (directory / "model.safetensors.index.json").exists()
    assert len(list(directory.glob("*.safetensors"))) > 1
    config = load_hf_config(directory)
    assert (config.num_kv_heads, config.head_dim, config.rms_norm_eps) == (2, 16, 1e-5)
    assert config.rope_scaling.factor == 8.0 and config.rope_theta == 500_000.0
    assert load_hf_config(checkpoints["qwen3"][1]).tie_embeddings


def test_rope_scaling_is_what_the_llama_parity_depends_on(checkpoints):
    """Negative control: without the llama3 scaling the same weights miss by far more."""
    torch_model, directory = checkpoints["llama"]
    model = load_hf_checkpoint(directory)
    unscaled_config = dataclasses.replace(model.config, rope_scaling=None)
    _, params = split_model(model)
    abstract = nnx.eval_shape(lambda: Transformer(unscaled_config, rngs=nnx.Rngs(0)))
    unscaled = nnx.merge(split_model(abstract)[0], params)
    tokens, positions, mask = _batch()
    error = _max_error_on_real_positions(
        _our_logits(unscaled, tokens, positions, mask),
        _torch_logits(torch_model, tokens, mask),
        mask,
    )
    assert error > 100 * FLOAT32_TOLERANCE


def test_gemma3_config_is_read_with_its_layer_pattern_window_and_two_rotary_bases(checkpoints):
    config = load_hf_config(checkpoints["gemma3"][1])
    assert (config.layer_attention, config.sliding_window) == (("sliding", "full"), GEMMA_WINDOW)
    assert (config.rope_theta, config.sliding_rope_theta, config.query_pre_attention_scalar) == (1e6, 1e4, 24)
    assert config.qk_norm and config.post_sublayer_norms and config.scale_embeddings and config.tie_embeddings
    assert config.mlp_activation == "gelu_tanh"


@pytest.mark.parametrize("change", ["no window", "one rotary base", "head_dim query scale"])
def test_each_gemma3_feature_is_what_its_parity_depends_on(checkpoints, change):
    """Negative controls: without the window, the local rotary base or the query scale, the logits miss."""
    torch_model, directory = checkpoints["gemma3"]
    model = load_hf_checkpoint(directory)
    altered_config = dataclasses.replace(model.config, **{
        "no window": {"sliding_window": 10 * max(LENGTHS)},
        "one rotary base": {"sliding_rope_theta": None},
        "head_dim query scale": {"query_pre_attention_scalar": None},
    }[change])
    abstract = nnx.eval_shape(lambda: Transformer(altered_config, rngs=nnx.Rngs(0)))
    altered = nnx.merge(split_model(abstract)[0], split_model(model)[1])
    tokens, positions, mask = _batch()
    error = _max_error_on_real_positions(
        _our_logits(altered, tokens, positions, mask), _torch_logits(torch_model, tokens, mask), mask)
    assert error > 100 * FLOAT32_TOLERANCE


def test_bfloat16_parameters_are_as_close_as_transformers_own_bfloat16(checkpoints):
    torch_model, directory = checkpoints["qwen3"]
    tokens, positions, mask = _batch()
    reference = _torch_logits(torch_model, tokens, mask)
    torch_bf16 = _torch_model("qwen3").to(torch.bfloat16)
    torch_error = _max_error_on_real_positions(
        _torch_logits(torch_bf16, tokens, mask), reference, mask
    )

    model = load_hf_checkpoint(directory, param_dtype="bfloat16")
    assert model.embedding.embedding[...].dtype == jnp.bfloat16
    logits = _our_logits(model, tokens, positions, mask)
    assert logits.dtype == np.float32
    our_error = _max_error_on_real_positions(logits, reference, mask)
    assert our_error < 2 * torch_error + 0.02, (our_error, torch_error)


def test_a_bfloat16_checkpoint_loads_as_bfloat16(tmp_path):
    _torch_model("qwen2").to(torch.bfloat16).save_pretrained(tmp_path)
    model = load_hf_checkpoint(tmp_path)
    assert model.config.param_dtype == "bfloat16"
    assert model.blocks[0].attention.query.bias[...].dtype == jnp.bfloat16


FAMILY_CONFIGS = {
    "LlamaForCausalLM": dict(
        rope_theta=500_000.0,
        rope_scaling={
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
        rms_norm_eps=1e-5,
    ),
    "Qwen2ForCausalLM": dict(qkv_bias=True, rope_theta=1_000_000.0),
    "Qwen3ForCausalLM": dict(qk_norm=True, head_dim=32, tie_embeddings=True),
    "Gemma3ForCausalLM": dict(
        qk_norm=True, head_dim=32, tie_embeddings=True, post_sublayer_norms=True, scale_embeddings=True,
        mlp_activation="gelu_tanh", layer_attention=("full", "sliding"), sliding_window=GEMMA_WINDOW,
        rope_theta=1_000_000.0, sliding_rope_theta=10_000.0, query_pre_attention_scalar=48,
    ),
}


def _randomized_ours(architecture: str) -> Transformer:
    config = TransformerConfig(
        vocab_size=VOCAB,
        d_model=64,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        mlp_dim=128,
        max_seq_len=64,
        **FAMILY_CONFIGS[architecture],
    )
    return random_model(config, 3)


@pytest.mark.parametrize("architecture", sorted(FAMILY_CONFIGS))
def test_exported_checkpoint_loads_in_transformers_with_the_same_logits(tmp_path, architecture):
    model = _randomized_ours(architecture)
    sharded = architecture == "Qwen2ForCausalLM"
    export_hf_checkpoint(
        model, tmp_path, architecture=architecture, max_shard_bytes=30_000 if sharded else None
    )
    assert (tmp_path / "model.safetensors.index.json").exists() == sharded

    torch_model = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, attn_implementation="eager", dtype=torch.float32
    ).eval()
    assert type(torch_model).__name__ == architecture
    tokens, positions, mask = _batch(1)
    error = _max_error_on_real_positions(
        _our_logits(model, tokens, positions, mask), _torch_logits(torch_model, tokens, mask), mask
    )
    assert error < FLOAT32_TOLERANCE, f"{architecture}: max |logit difference| {error:.2e}"

    reloaded = load_hf_checkpoint(tmp_path)
    assert reloaded.config == model.config
    ours = jax.tree.leaves_with_path(nnx.to_pure_dict(split_model(model)[1]))
    theirs = jax.tree.leaves_with_path(nnx.to_pure_dict(split_model(reloaded)[1]))
    assert [path for path, _ in ours] == [path for path, _ in theirs]
    for (path, our_value), (_, their_value) in zip(ours, theirs, strict=True):
        if architecture == "Gemma3ForCausalLM" and path[-1].key == "scale":
            # Stored as scale - 1 and read back as weight + 1: one float32 rounding each way.
            np.testing.assert_allclose(our_value, their_value, rtol=2e-7, err_msg=jax.tree_util.keystr(path))
        else:
            np.testing.assert_array_equal(our_value, their_value, err_msg=jax.tree_util.keystr(path))


def test_export_refuses_an_architecture_that_cannot_express_the_model(tmp_path):
    model = _randomized_ours("Qwen3ForCausalLM")
    with pytest.raises(ValueError, match="qk_norm"):
        export_hf_checkpoint(model, tmp_path, architecture="LlamaForCausalLM")
    with pytest.raises(ValueError, match="post_sublayer_norms"):
        export_hf_checkpoint(_randomized_ours("Gemma3ForCausalLM"), tmp_path, architecture="Qwen3ForCausalLM")


@pytest.mark.parametrize("architecture", sorted(FAMILY_CONFIGS))
def test_without_an_architecture_the_export_takes_the_one_that_expresses_the_model(tmp_path, architecture):
    export_hf_checkpoint(_randomized_ours(architecture), tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [architecture]


def _copy_checkpoint(source, destination):
    destination.mkdir()
    for file in source.iterdir():
        (destination / file.name).write_bytes(file.read_bytes())
    return destination


def test_an_unsupported_architecture_is_refused_naming_the_field(checkpoints, tmp_path):
    directory = _copy_checkpoint(checkpoints["qwen2"][1], tmp_path / "checkpoint")
    config = json.loads((directory / "config.json").read_text())
    with pytest.raises(CheckpointError, match="'architectures'"):
        (directory / "config.json").write_text(
            json.dumps({**config, "architectures": ["MistralForCausalLM"]})
        )
        load_hf_config(directory)
    with pytest.raises(CheckpointError, match="'use_sliding_window'"):
        (directory / "config.json").write_text(json.dumps({**config, "use_sliding_window": True}))
        load_hf_config(directory)


def test_missing_and_misshaped_tensors_are_refused_by_name(checkpoints, tmp_path):
    directory = _copy_checkpoint(checkpoints["qwen2"][1], tmp_path / "checkpoint")
    tensors = load_file(str(directory / "model.safetensors"))
    name = "model.layers.1.self_attn.k_proj.bias"

    save_file({k: v for k, v in tensors.items() if k != name}, str(directory / "model.safetensors"))
    with pytest.raises(CheckpointError, match=name):
        load_hf_checkpoint(directory)

    save_file({**tensors, name: tensors[name][:-1]}, str(directory / "model.safetensors"))
    with pytest.raises(CheckpointError, match=rf"{name} has shape \(31,\)"):
        load_hf_checkpoint(directory)

    save_file(
        {**tensors, "model.layers.2.mlp.up_proj.weight": tensors[name]},
        str(directory / "model.safetensors"),
    )
    with pytest.raises(CheckpointError, match="model.layers.2.mlp.up_proj.weight"):
        load_hf_checkpoint(directory)


def test_a_run_config_with_hf_checkpoint_starts_from_it(checkpoints):
    torch_model, directory = checkpoints["qwen3"]
    model_config = ModelConfig(hf_checkpoint=str(directory), max_seq_len=64)
    model = create_model(model_config, vocab_size=100, rngs=nnx.Rngs(0))
    assert model.config.max_seq_len == 64 and model.config.qk_norm
    with pytest.raises(CheckpointError, match="tokenizer has 1000 tokens"):
        create_model(model_config, vocab_size=1000, rngs=nnx.Rngs(0))
