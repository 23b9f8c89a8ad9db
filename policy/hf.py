"""Hugging Face checkpoints: Llama 3, Qwen2, Qwen3 and Gemma 3 (text) in, and out again.

:func:`load_hf_checkpoint` reads a ``save_pretrained`` directory (config.json
plus one or several ``*.safetensors`` files) into a :class:`Transformer`;
:func:`export_hf_checkpoint` writes one that ``transformers`` loads with
``AutoModelForCausalLM.from_pretrained``. Tensors are read and written with
``safetensors``' numpy backend; torch is never imported.

The mapping is one-to-one and checked both ways: a checkpoint tensor that is
missing, has the wrong shape, or has no place in the model is an error that
names it. Hugging Face stores Linear weights as [out, in] and nnx as [in,
out], so projection kernels are transposed; both sides use the same
"rotate half" rotary layout, so query and key weights need no permutation.
Gemma's RMSNorms scale by ``1 + weight`` where ours scale by ``scale``, so its
norm weights gain 1 on the way in and lose it on the way out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.numpy import save_file

from policy.model import Transformer, TransformerConfig
from tandem.configs.model import RopeScaling

# What each architecture fixes of the model's features (TransformerConfig fields); the rest
# come from config.json.
_LLAMA_FEATURES = {"qkv_bias": False, "qk_norm": False, "post_sublayer_norms": False,
                   "scale_embeddings": False, "mlp_activation": "silu"}
_ARCHITECTURES: dict[str, dict[str, Any]] = {
    "LlamaForCausalLM": {**_LLAMA_FEATURES},
    "Qwen2ForCausalLM": {**_LLAMA_FEATURES, "qkv_bias": True},
    "Qwen3ForCausalLM": {**_LLAMA_FEATURES, "qk_norm": True},
    "Gemma3ForCausalLM": {**_LLAMA_FEATURES, "qk_norm": True, "post_sublayer_norms": True,
                          "scale_embeddings": True, "mlp_activation": "gelu_tanh"},
}
# The model_type of each architecture (how GGUF files and config.json name it).
_MODEL_TYPES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
                "Gemma3ForCausalLM": "gemma3_text"}
# Architectures whose RMSNorm weights are stored as ``scale - 1`` (see the module doc).
_NORM_WEIGHT_OFFSET = {"Gemma3ForCausalLM": 1.0}
# Architectures with sliding-window layers between the full ones, and their own rotary base.
_SLIDING_ARCHITECTURES = {"Gemma3ForCausalLM"}
# config.json's activation names, and ours.
_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}
# config.json's layer_types, and ours.
_LAYER_TYPES = {"full_attention": "full", "sliding_attention": "sliding"}
_INDEX_FILE = "model.safetensors.index.json"
# Buffers some older checkpoints carry; recomputed from the config, so skipped.
_IGNORED_TENSORS = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")


def architecture_of_model_type(model_type: str) -> str | None:
    """The ``architectures`` entry of a supported ``model_type`` (as GGUF files name a model), or None."""
    return next((name for name, known in _MODEL_TYPES.items() if known == model_type), None)


def architecture_of(config: TransformerConfig) -> str:
    """The Hugging Face architecture that expresses ``config``, as :func:`export_hf_checkpoint` takes it.

    Raises:
      ValueError: no supported architecture has ``config``'s combination of features.
    """
    for architecture, features in _ARCHITECTURES.items():
        if all(getattr(config, feature) == value for feature, value in features.items()):
            return architecture
    raise ValueError(
        "no supported Hugging Face architecture has the model's features "
        f"{ {feature: getattr(config, feature) for feature in _LLAMA_FEATURES} }"
    )


class CheckpointError(ValueError):
    """A checkpoint that does not describe a model we can build, with the offending field named."""


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path} does not exist") from None


def _architecture(hf_config: Mapping[str, Any]) -> str:
    architectures = hf_config.get("architectures") or []
    if len(architectures) != 1 or architectures[0] not in _ARCHITECTURES:
        raise CheckpointError(
            f"config.json field 'architectures'={architectures!r} is not supported; "
            f"expected one of {sorted(_ARCHITECTURES)}"
        )
    return architectures[0]


def _rope(hf_config: Mapping[str, Any]) -> tuple[float, RopeScaling | None]:
    """(rope_theta, rope_scaling) from either transformers 5 ``rope_parameters`` or 4.x keys.

    Of a model with rotary parameters per layer type (Gemma 3), those of its full layers.
    """
    parameters = hf_config.get("rope_parameters")
    if isinstance(parameters, Mapping) and "full_attention" in parameters:
        parameters = parameters["full_attention"]
    if parameters is not None:
        if not isinstance(parameters, Mapping) or "rope_theta" not in parameters:
            raise CheckpointError(
                "config.json field 'rope_parameters' must be one dict with 'rope_theta' "
                f"(per-layer rope parameters are not supported), got {parameters!r}"
            )
        theta = float(parameters["rope_theta"])
        scaling = {key: value for key, value in parameters.items() if key != "rope_theta"}
    else:
        theta = float(hf_config.get("rope_theta", 10_000.0))
        scaling = dict(hf_config.get("rope_scaling") or {})
    rope_type = scaling.pop("rope_type", scaling.pop("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise CheckpointError(
            f"config.json field 'rope_scaling' has rope_type={rope_type!r}; only 'llama3' "
            "and the default are supported"
        )
    try:
        return theta, RopeScaling.from_dict({"rope_type": rope_type, **scaling})
    except (ValueError, KeyError) as error:
        raise CheckpointError(f"config.json field 'rope_scaling': {error}") from None


def _refuse(field: str, value: Any, supported: Any) -> None:
    raise CheckpointError(
        f"config.json field {field!r}={value!r} is not supported (supported: {supported!r})"
    )


def _sliding_layers(hf_config: Mapping[str, Any], architecture: str) -> dict[str, Any]:
    """The TransformerConfig fields of sliding-window layers: none but for Gemma 3's pattern."""
    if architecture not in _SLIDING_ARCHITECTURES:
        if hf_config.get("use_sliding_window", False):
            _refuse("use_sliding_window", True, False)
        layer_types = set(hf_config.get("layer_types") or ["full_attention"])
        if layer_types != {"full_attention"}:
            _refuse("layer_types", sorted(layer_types), ["full_attention"])
        return {}
    num_layers = int(hf_config["num_hidden_layers"])
    layer_types = hf_config.get("layer_types")
    if layer_types is None:
        # transformers 4.x Gemma 3 configs: every pattern-th layer is full, the rest sliding.
        pattern = int(hf_config.get("sliding_window_pattern", hf_config.get("_sliding_window_pattern", 6)))
        layer_types = ["full_attention" if (index + 1) % pattern == 0 else "sliding_attention"
                       for index in range(num_layers)]
    unknown = sorted(set(layer_types) - set(_LAYER_TYPES))
    if unknown:
        _refuse("layer_types", unknown, sorted(_LAYER_TYPES))
    window = hf_config.get("sliding_window")
    if "sliding_attention" in layer_types and not window:
        _refuse("sliding_window", window, "a window of at least one token")
    parameters = hf_config.get("rope_parameters")
    if isinstance(parameters, Mapping) and "sliding_attention" in parameters:
        sliding = dict(parameters["sliding_attention"] or {})
        if sliding.get("rope_type", "default") != "default":
            _refuse("rope_parameters.sliding_attention.rope_type", sliding["rope_type"], "default")
        sliding_theta = sliding.get("rope_theta")
    else:
        sliding_theta = hf_config.get("rope_local_base_freq")
    if hf_config.get("use_bidirectional_attention", False):
        _refuse("use_bidirectional_attention", True, False)
    for field in ("attn_logit_softcapping", "final_logit_softcapping"):
        if hf_config.get(field) is not None:
            _refuse(field, hf_config[field], None)
    return {
        "layer_attention": tuple(_LAYER_TYPES[kind] for kind in layer_types),
        "sliding_window": int(window) if window else None,
        "sliding_rope_theta": float(sliding_theta) if sliding_theta is not None else None,
        "query_pre_attention_scalar": (
            int(hf_config["query_pre_attn_scalar"]) if hf_config.get("query_pre_attn_scalar") else None),
    }


def transformer_config_from_hf(
    hf_config: Mapping[str, Any], *, max_seq_len: int | None = None, param_dtype: str | None = None
) -> TransformerConfig:
    """The :class:`TransformerConfig` of a parsed config.json; see :func:`load_hf_config`."""
    architecture = _architecture(hf_config)
    features = _ARCHITECTURES[architecture]
    activation_field = "hidden_activation" if "hidden_activation" in hf_config else "hidden_act"
    activation = hf_config.get(activation_field) or "silu"
    if _ACTIVATIONS.get(activation) != features["mlp_activation"]:
        expected = next(name for name, ours in _ACTIVATIONS.items() if ours == features["mlp_activation"])
        _refuse(activation_field, activation, expected)
    if hf_config.get("attention_bias", False):
        _refuse("attention_bias", True, False)
    if hf_config.get("mlp_bias", False):
        _refuse("mlp_bias", True, False)
    sliding = _sliding_layers(hf_config, architecture)
    if hf_config.get("partial_rotary_factor", 1.0) != 1.0:
        _refuse("partial_rotary_factor", hf_config["partial_rotary_factor"], 1.0)
    rope_theta, rope_scaling = _rope(hf_config)
    if param_dtype is None:
        stored = hf_config.get("dtype", hf_config.get("torch_dtype"))
        param_dtype = "bfloat16" if stored == "bfloat16" else "float32"
    try:
        num_heads = int(hf_config["num_attention_heads"])
        return TransformerConfig(
            vocab_size=int(hf_config["vocab_size"]),
            d_model=int(hf_config["hidden_size"]),
            num_layers=int(hf_config["num_hidden_layers"]),
            num_heads=num_heads,
            mlp_dim=int(hf_config["intermediate_size"]),
            max_seq_len=int(max_seq_len or hf_config.get("max_position_embeddings", 2048)),
            num_kv_heads=int(hf_config.get("num_key_value_heads") or num_heads),
            head_dim=hf_config.get("head_dim"),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            rms_norm_eps=float(hf_config.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(hf_config.get("tie_word_embeddings", False)),
            param_dtype=param_dtype,
            **features,
            **sliding,
        )
    except KeyError as error:
        raise CheckpointError(f"config.json lacks the field {error.args[0]!r}") from None


def load_hf_config(
    path: str | Path, *, max_seq_len: int | None = None, param_dtype: str | None = None
) -> TransformerConfig:
    """The architecture of the checkpoint directory ``path``, from its config.json.

    Args:
      path: directory holding config.json.
      max_seq_len: overrides ``max_position_embeddings`` (often 128k: far more than
        a run samples, and the sampler's buckets follow this number).
      param_dtype: "float32" or "bfloat16"; None takes the checkpoint's ``dtype`` /
        ``torch_dtype`` when it is bfloat16, float32 otherwise.
    Raises:
      CheckpointError: an unsupported architecture or feature, naming the config.json field.
    """
    hf_config = _read_json(Path(path) / "config.json")
    return transformer_config_from_hf(hf_config, max_seq_len=max_seq_len, param_dtype=param_dtype)


def _hf_tensor_layout(config: TransformerConfig) -> Iterator[tuple[str, tuple, bool]]:
    """(Hugging Face name, path in the nnx params, transpose?) of every tensor of ``config``.

    The names of the norms around the MLP follow the architecture: Llama's
    ``post_attention_layernorm`` is the norm before the MLP, while Gemma, which norms
    after each sublayer too, calls that one ``pre_feedforward_layernorm``.
    """
    yield "model.embed_tokens.weight", ("embedding", "embedding"), False
    for index in range(config.num_layers):
        hf_prefix = f"model.layers.{index}"
        block = ("blocks", index)
        for hf_name, name in (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "value")):
            projection = (*block, "attention", name)
            yield f"{hf_prefix}.self_attn.{hf_name}.weight", (*projection, "kernel"), True
            if config.qkv_bias:
                yield f"{hf_prefix}.self_attn.{hf_name}.bias", (*projection, "bias"), False
        yield (
            f"{hf_prefix}.self_attn.o_proj.weight",
            (*block, "attention", "output", "kernel"),
            True,
        )
        if config.qk_norm:
            yield (
                f"{hf_prefix}.self_attn.q_norm.weight",
                (*block, "attention", "query_norm", "scale"),
                False,
            )
            yield (
                f"{hf_prefix}.self_attn.k_norm.weight",
                (*block, "attention", "key_norm", "scale"),
                False,
            )
        for hf_name, name in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")):
            yield f"{hf_prefix}.mlp.{hf_name}.weight", (*block, "mlp", name, "kernel"), True
        yield f"{hf_prefix}.input_layernorm.weight", (*block, "attention_norm", "scale"), False
        if config.post_sublayer_norms:
            for hf_name, name in (("post_attention_layernorm", "post_attention_norm"),
                                  ("pre_feedforward_layernorm", "mlp_norm"),
                                  ("post_feedforward_layernorm", "post_mlp_norm")):
                yield f"{hf_prefix}.{hf_name}.weight", (*block, name, "scale"), False
        else:
            yield f"{hf_prefix}.post_attention_layernorm.weight", (*block, "mlp_norm", "scale"), False
    yield "model.norm.weight", ("final_norm", "scale"), False
    if not config.tie_embeddings:
        yield "lm_head.weight", ("head", "kernel"), True


def _safetensors_files(directory: Path) -> dict[str, Path]:
    """Tensor name -> file holding it, from the index when the checkpoint is sharded."""
    index_path = directory / _INDEX_FILE
    if index_path.exists():
        weight_map = _read_json(index_path).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index_path} lacks a 'weight_map'")
        return {name: directory / file for name, file in weight_map.items()}
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{directory} holds no *.safetensors file")
    locations = {}
    for file in files:
        with safe_open(file, framework="numpy") as reader:
            locations.update({name: file for name in reader.keys()})  # noqa: SIM118
    return locations


def _nested_set(tree: dict, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def load_hf_checkpoint(
    path: str | Path, *, param_dtype: str | None = None, max_seq_len: int | None = None
) -> Transformer:
    """A :class:`Transformer` with the weights of the checkpoint directory ``path``.

    Reads ``model.safetensors``, or the shards listed by
    ``model.safetensors.index.json``. ``param_dtype`` and ``max_seq_len`` are
    as in :func:`load_hf_config`. Parameters are never randomly initialized
    first (the model is built abstractly and filled), so loading costs one
    copy of the weights.

    Raises:
      CheckpointError: unsupported config, or a tensor that is missing, mis-shaped
        or unexpected (named in the message).
    """
    directory = Path(path)
    hf_config = _read_json(directory / "config.json")
    config = transformer_config_from_hf(hf_config, max_seq_len=max_seq_len, param_dtype=param_dtype)
    norm_offset = _NORM_WEIGHT_OFFSET.get(_architecture(hf_config), 0.0)
    locations = _safetensors_files(directory)
    layout = list(_hf_tensor_layout(config))

    expected = {name for name, _, _ in layout}
    unexpected = sorted(
        name
        for name in locations
        if name not in expected
        and not _IGNORED_TENSORS.fullmatch(name)
        # Some tied checkpoints also store the (identical) head.
        and not (config.tie_embeddings and name == "lm_head.weight")
    )
    if unexpected:
        raise CheckpointError(
            f"checkpoint tensors {unexpected[:5]} (of {len(unexpected)}) have no place in a "
            f"{config.num_layers}-layer model with qkv_bias={config.qkv_bias}, "
            f"qk_norm={config.qk_norm}, tie_embeddings={config.tie_embeddings}"
        )
    missing = [name for name in expected if name not in locations]
    if missing:
        raise CheckpointError(f"checkpoint lacks tensors {missing[:5]} (of {len(missing)})")

    abstract = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
    graphdef, abstract_params = nnx.split(abstract, nnx.Param)
    shapes = nnx.to_pure_dict(abstract_params)

    by_file: dict[Path, list[tuple[str, tuple, bool]]] = {}
    for entry in layout:
        by_file.setdefault(locations[entry[0]], []).append(entry)
    values: dict = {}
    for file, entries in by_file.items():
        with safe_open(file, framework="numpy") as reader:
            for name, param_path, transpose in entries:
                tensor = reader.get_tensor(name)
                if transpose:
                    tensor = tensor.T
                if norm_offset and param_path[-1] == "scale":
                    # In float32, as transformers adds it, whatever the stored dtype.
                    tensor = tensor.astype(np.float32) + np.float32(norm_offset)
                target = shapes
                for key in param_path:
                    target = target[key]
                if tensor.shape != target.shape:
                    raise CheckpointError(
                        f"checkpoint tensor {name} has shape "
                        f"{tensor.T.shape if transpose else tensor.shape}, expected "
                        f"{target.shape[::-1] if transpose else target.shape}"
                    )
                _nested_set(values, param_path, jnp.asarray(tensor, dtype=config.dtype))
    nnx.replace_by_pure_dict(abstract_params, values)
    return nnx.merge(graphdef, abstract_params)


def hf_config_of(
    config: TransformerConfig,
    *,
    architecture: str,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
) -> dict[str, Any]:
    """The config.json dict of ``config`` as ``architecture`` (e.g. "Qwen3ForCausalLM").

    Writes the rotary settings both the transformers 4.x way (``rope_theta``,
    ``rope_scaling``) and the 5.x way (``rope_parameters``), so either loads it.

    Raises:
      ValueError: ``architecture`` is unknown or cannot express ``config`` (e.g. QK-norm
        as Llama, or Qwen2 without its QKV bias).
    """
    if architecture not in _ARCHITECTURES:
        raise ValueError(f"architecture={architecture!r} is not one of {sorted(_ARCHITECTURES)}")
    features = _ARCHITECTURES[architecture]
    for feature in features:
        if getattr(config, feature) != features[feature]:
            raise ValueError(
                f"{architecture} requires {feature}={features[feature]}, the model has "
                f"{feature}={getattr(config, feature)}"
            )
    rope_scaling = config.rope_scaling.to_dict() if config.rope_scaling else None
    rope_parameters = {
        "rope_type": "default",
        **(rope_scaling or {}),
        "rope_theta": config.rope_theta,
    }
    hf_config: dict[str, Any] = {
        "architectures": [architecture],
        "model_type": _MODEL_TYPES[architecture],
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.mlp_dim,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_seq_len,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": rope_scaling,
        "rope_parameters": rope_parameters,
        "tie_word_embeddings": config.tie_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "dtype": config.param_dtype,
        "torch_dtype": config.param_dtype,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "use_cache": True,
    }
    if architecture == "LlamaForCausalLM":
        hf_config["mlp_bias"] = False
    elif architecture in _SLIDING_ARCHITECTURES:
        del hf_config["hidden_act"]
        hf_config["hidden_activation"] = next(
            name for name, ours in _ACTIVATIONS.items() if ours == config.mlp_activation)
        kinds = config.layer_attention or ("full",) * config.num_layers
        hf_config["layer_types"] = [
            next(name for name, ours in _LAYER_TYPES.items() if ours == kind) for kind in kinds]
        hf_config["sliding_window"] = config.sliding_window
        hf_config["query_pre_attn_scalar"] = config.query_pre_attention_scalar or config.head_dim
        hf_config["attn_logit_softcapping"] = hf_config["final_logit_softcapping"] = None
        sliding_theta = config.sliding_rope_theta or config.rope_theta
        hf_config["rope_local_base_freq"] = sliding_theta
        hf_config["rope_parameters"] = {
            "full_attention": rope_parameters,
            "sliding_attention": {"rope_type": "default", "rope_theta": sliding_theta},
        }
    else:
        hf_config["use_sliding_window"] = False
        hf_config["sliding_window"] = None
        hf_config["max_window_layers"] = config.num_layers
        hf_config["layer_types"] = ["full_attention"] * config.num_layers
    return hf_config


def export_hf_checkpoint(
    model: Transformer,
    path: str | Path,
    *,
    architecture: str | None = None,
    max_shard_bytes: int | None = None,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
    untie_head: bool = False,
) -> list[Path]:
    """Write ``model`` to the directory ``path`` as a Hugging Face checkpoint; returns the files.

    ``architecture`` None is the one that expresses the model (:func:`architecture_of`).
    Writes config.json (see :func:`hf_config_of`) and ``model.safetensors``, or,
    when the tensors exceed ``max_shard_bytes``, shards
    ``model-0000i-of-0000n.safetensors`` plus ``model.safetensors.index.json``
    (a single tensor larger than the limit gets a shard of its own). Tensors
    keep the model's parameter dtype. The model must be a plain
    :class:`Transformer`; fold LoRA adapters into it first. ``untie_head``: a model whose output head
    is its embedding is written with ``lm_head.weight``, a copy, and ``tie_word_embeddings`` false
    (vLLM's in-place reload leaves a tied head alone: workers/remote_weights.py).
    """
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    config = model.config
    architecture = architecture or architecture_of(config)
    hf_config = hf_config_of(
        config, architecture=architecture, bos_token_id=bos_token_id, eos_token_id=eos_token_id
    )
    params = jax.device_get(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    norm_offset = _NORM_WEIGHT_OFFSET.get(architecture, 0.0)

    tensors: dict[str, np.ndarray] = {}
    for name, param_path, transpose in _hf_tensor_layout(config):
        value = params
        for key in param_path:
            value = value[key]
        value = np.asarray(value)
        if norm_offset and param_path[-1] == "scale":
            value = (value.astype(np.float32) - np.float32(norm_offset)).astype(value.dtype)
        tensors[name] = np.ascontiguousarray(value.T if transpose else value)
    if untie_head and config.tie_embeddings:
        tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].copy()
        hf_config["tie_word_embeddings"] = False

    shards: list[dict[str, np.ndarray]] = [{}]
    shard_bytes = 0
    for name, tensor in tensors.items():
        if (
            max_shard_bytes is not None
            and shards[-1]
            and shard_bytes + tensor.nbytes > max_shard_bytes
        ):
            shards.append({})
            shard_bytes = 0
        shards[-1][name] = tensor
        shard_bytes += tensor.nbytes

    (directory / "config.json").write_text(json.dumps(hf_config, indent=2) + "\n")
    written = [directory / "config.json"]
    metadata = {"format": "pt"}  # transformers refuses safetensors without it
    if len(shards) == 1:
        save_file(shards[0], str(directory / "model.safetensors"), metadata=metadata)
        return [*written, directory / "model.safetensors"]
    weight_map = {}
    for number, shard in enumerate(shards, start=1):
        file_name = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(directory / file_name), metadata=metadata)
        weight_map.update({name: file_name for name in shard})
        written.append(directory / file_name)
    index = {
        "metadata": {"total_size": sum(tensor.nbytes for tensor in tensors.values())},
        "weight_map": weight_map,
    }
    (directory / _INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return [*written, directory / _INDEX_FILE]

