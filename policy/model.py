"""The decoder-only transformer policy, with a functional KV cache for sampling.

One module family covers the nano model trained from scratch and Llama 3 /
Qwen2 / Qwen3 / Gemma 3 checkpoints (see :mod:`policy.hf`): pre-norm blocks with
RMSNorm, rotary positions (optionally Llama-3 scaled), grouped-query
attention (optionally with Qwen2's QKV bias or Qwen3's QK-norm) and a SwiGLU
MLP, with a tied or untied output head. Gemma 3 adds, each behind a config
field: layers of sliding-window attention with their own rotary base between
the global ones, a norm after each sublayer as well as before it, a GeGLU MLP,
and embeddings scaled by sqrt(d_model).

One module serves both the trainer (full-sequence forward) and the sampler
(prefill and token-by-token decode over a cache). Both paths share one
attention kernel, so the logits a producer sampled from are the logits the
trainer recomputes, up to float rounding.

Conventions every caller relies on:

- Causality is by *slot index* (a query at slot ``i`` sees keys at slots
  ``<= i``), and padding is excluded only through the boolean key mask. The
  ``positions`` input feeds the rotary embedding alone, so a left-padded
  prompt (sampler) and a right-padded conversation (trainer) produce the same
  logits for their real tokens as long as the real tokens get positions
  ``0, 1, 2, ...``.
- Masked scores use a large finite negative number instead of ``-inf``: a
  query row whose keys are all padding (the left padding itself) then attends
  uniformly to garbage instead of producing NaN, and a zero loss mask on such
  rows keeps gradients finite.
- Parameters are the model's only state. :func:`split_model` is the one way
  the rest of the trainer turns a model into ``(graphdef, params)``.
- Attention scores, softmax and rotary angles are computed in float32 whatever
  the parameter dtype; logits and :meth:`Transformer.hidden_states` are
  returned as float32.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping
from typing import Any, get_args

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from policy.tokenizer import VOCAB_SIZE as BYTE_VOCAB_SIZE
from tandem.configs.memory import RematPolicy
from tandem.configs.model import (
    PARAM_DTYPES,
    AttentionKind,
    MlpActivation,
    ModelConfig,
    RopeScaling,
    attention_heads,
)

# A per-layer list of {"key": [B, KV, L, Dh], "value": [B, KV, L, Dh]} arrays
# (KV = num_kv_heads: grouped-query attention caches only the shared heads).
# Heads come before slots because that is the layout attention reads them in:
# with slots first, every decoded token would copy the whole cache to transpose it.
KVCache = list[dict[str, jax.Array]]

# Added to the scores of keys a query must not see. Finite (see module doc).
_MASKED_SCORE = -1e9

# The jnp dtype of each name in tandem.configs.model.PARAM_DTYPES.
_JNP_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Static shape of the policy; hashable, so it can key compiled functions.

    ``num_kv_heads`` and ``head_dim`` left as None are resolved in
    ``__post_init__`` (to ``num_heads`` and ``d_model // num_heads``), so two
    configs describing the same model compare equal. A ``rope_scaling`` given
    as a dict is turned into a :class:`RopeScaling`.
    """

    # Number of token ids the embedding and the output head cover.
    vocab_size: int
    # Width of the residual stream.
    d_model: int
    # Number of transformer blocks.
    num_layers: int
    # Query heads. Without an explicit head_dim it must divide d_model.
    num_heads: int
    # Hidden width of each SwiGLU MLP.
    mlp_dim: int
    # Longest sequence (prompt plus generation) the policy is asked to handle.
    max_seq_len: int
    # Key/value heads of grouped-query attention; must divide num_heads. None: num_heads (MHA).
    num_kv_heads: int | None = None
    # Width of each attention head; must be even (rotary). None: d_model // num_heads.
    head_dim: int | None = None
    # Base wavelength of the rotary embedding (10k in RoFormer, 500k in Llama 3, 1M in Qwen).
    rope_theta: float = 10_000.0
    # Llama-3-style frequency scaling of the rotary embedding; None: plain RoPE.
    rope_scaling: RopeScaling | None = None
    # Epsilon of every RMSNorm (1e-6 is nnx.RMSNorm's default; Llama 3 uses 1e-5).
    rms_norm_eps: float = 1e-6
    # Biases on the query, key and value projections (Qwen2).
    qkv_bias: bool = False
    # RMSNorm over head_dim on queries and keys before the rotary embedding (Qwen3).
    qk_norm: bool = False
    # Output head shares the embedding matrix (small Llama 3.2 and Qwen3 models).
    tie_embeddings: bool = False
    # Dtype of the parameters and of the matmuls: "float32" or "bfloat16".
    param_dtype: str = "float32"
    # Attention of each layer, "full" or "sliding" (a list is turned into a tuple). None: all full.
    layer_attention: tuple[AttentionKind, ...] | None = None
    # Keys a sliding layer's query sees, its own included (Gemma 3: 512). Required by sliding layers.
    sliding_window: int | None = None
    # Rotary base of the sliding layers, without rope_scaling (Gemma 3: 10k; its global layers 1M).
    # None: rope_theta.
    sliding_rope_theta: float | None = None
    # Scores are q.k / sqrt(query_pre_attention_scalar) (Gemma's name). None: head_dim.
    query_pre_attention_scalar: int | None = None
    # Each sublayer's output is normed again before it joins the residual stream (Gemma 2 and 3).
    post_sublayer_norms: bool = False
    # The gate of the gated MLP: "silu" (SwiGLU) or "gelu_tanh" (GeGLU, Gemma).
    mlp_activation: MlpActivation = "silu"
    # Embeddings are multiplied by sqrt(d_model), rounded to param_dtype, on the way in (Gemma).
    scale_embeddings: bool = False

    def __post_init__(self) -> None:
        # The run config checks the same rules (tandem.configs.model).
        num_kv_heads, head_dim = attention_heads(
            d_model=self.d_model,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
        )
        object.__setattr__(self, "num_kv_heads", num_kv_heads)
        object.__setattr__(self, "head_dim", head_dim)
        if isinstance(self.rope_scaling, Mapping):
            object.__setattr__(self, "rope_scaling", RopeScaling.from_dict(self.rope_scaling))
        if self.param_dtype not in PARAM_DTYPES:
            raise ValueError(
                f"param_dtype={self.param_dtype!r} is not one of {sorted(PARAM_DTYPES)}"
            )
        if self.mlp_activation not in get_args(MlpActivation):
            raise ValueError(
                f"mlp_activation={self.mlp_activation!r} is not one of {list(get_args(MlpActivation))}"
            )
        if self.layer_attention is not None:
            kinds = tuple(self.layer_attention)
            object.__setattr__(self, "layer_attention", kinds)
            if len(kinds) != self.num_layers:
                raise ValueError(
                    f"layer_attention has {len(kinds)} entries for num_layers={self.num_layers}"
                )
            unknown = sorted(set(kinds) - set(get_args(AttentionKind)))
            if unknown:
                raise ValueError(
                    f"layer_attention holds {unknown}, not one of {list(get_args(AttentionKind))}"
                )
            if "sliding" in kinds and (self.sliding_window is None or self.sliding_window < 1):
                raise ValueError(
                    f"sliding layers need a sliding_window of at least 1, got {self.sliding_window!r}"
                )

    def attention_of_layer(self, index: int) -> AttentionKind:
        """``full`` or ``sliding``: what layer ``index`` attends to."""
        return "full" if self.layer_attention is None else self.layer_attention[index]

    @property
    def dtype(self) -> Any:
        """The jnp dtype of parameters and matmuls."""
        return _JNP_DTYPES[self.param_dtype]

    @classmethod
    def from_model_config(cls, model_config: ModelConfig, vocab_size: int) -> TransformerConfig:
        """The run config leaves the vocabulary to the tokenizer, so it is passed separately.

        ``model_config.hf_checkpoint`` is not read here; :func:`policy.factory.create_model`
        takes the architecture from the checkpoint when it is set.
        """
        return cls(
            vocab_size=vocab_size,
            d_model=model_config.d_model,
            num_layers=model_config.num_layers,
            num_heads=model_config.num_heads,
            mlp_dim=model_config.mlp_dim,
            max_seq_len=model_config.max_seq_len,
            num_kv_heads=model_config.num_kv_heads,
            head_dim=model_config.head_dim,
            rope_theta=model_config.rope_theta,
            rope_scaling=model_config.rope_scaling,
            rms_norm_eps=model_config.rms_norm_eps,
            qkv_bias=model_config.qkv_bias,
            qk_norm=model_config.qk_norm,
            tie_embeddings=model_config.tie_embeddings,
            param_dtype=model_config.param_dtype,
        )


# Named shapes. "nano" is the run config's default; "small" is a benchmark size
# (~12.7M parameters); the last two match public checkpoints' config.json, for
# memory and throughput estimates (tests never instantiate them).
_PRESETS: dict[str, dict[str, Any]] = {
    "nano": dict(
        vocab_size=BYTE_VOCAB_SIZE,
        d_model=64,
        num_layers=2,
        num_heads=4,
        mlp_dim=256,
        max_seq_len=512,
    ),
    "small": dict(
        vocab_size=BYTE_VOCAB_SIZE,
        d_model=384,
        num_layers=8,
        num_heads=6,
        num_kv_heads=2,
        mlp_dim=1024,
        max_seq_len=1024,
    ),
    "llama-3.2-1b": dict(
        vocab_size=128_256,
        d_model=2048,
        num_layers=16,
        num_heads=32,
        num_kv_heads=8,
        head_dim=64,
        mlp_dim=8192,
        max_seq_len=131_072,
        rope_theta=500_000.0,
        rope_scaling=RopeScaling(
            factor=32.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        ),
        rms_norm_eps=1e-5,
        tie_embeddings=True,
        param_dtype="bfloat16",
    ),
    "qwen3-0.6b": dict(
        vocab_size=151_936,
        d_model=1024,
        num_layers=28,
        num_heads=16,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=3072,
        max_seq_len=40_960,
        rope_theta=1_000_000.0,
        qk_norm=True,
        tie_embeddings=True,
        param_dtype="bfloat16",
    ),
}


def preset(name: str) -> TransformerConfig:
    """The named config: one of "nano", "small", "llama-3.2-1b", "qwen3-0.6b".

    "nano" and "small" use the byte tokenizer's vocabulary.
    """
    if name not in _PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of {sorted(_PRESETS)}")
    return TransformerConfig(**_PRESETS[name])


@functools.lru_cache(maxsize=64)
def _inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None) -> np.ndarray:
    """[head_dim / 2] float32 rotary frequencies, computed as Hugging Face does (float32).

    The float32 arithmetic mirrors ``transformers`` so that the angles, and
    hence logits at long positions, agree bit for bit as far as possible.
    """
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inverse = (np.float32(1.0) / (np.float32(theta) ** exponents)).astype(np.float32)
    if scaling is None:
        return inverse
    old_context = scaling.original_max_position_embeddings
    low_freq_wavelength = old_context / scaling.low_freq_factor
    high_freq_wavelength = old_context / scaling.high_freq_factor
    wavelength = (np.float32(2 * math.pi) / inverse).astype(np.float32)
    scaled = np.where(wavelength > low_freq_wavelength, inverse / scaling.factor, inverse)
    smooth = (old_context / wavelength - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelength >= high_freq_wavelength) & (wavelength <= low_freq_wavelength)
    return np.where(medium, smoothed, scaled).astype(np.float32)


def _apply_rotary(x: jax.Array, positions: jax.Array, inverse_frequency: np.ndarray) -> jax.Array:
    """Rotate pairs of features of ``x`` [B, T, H, Dh] by angles set by ``positions`` [B, T].

    Uses the "rotate half" layout of Hugging Face Llama and Qwen (feature
    ``i`` paired with feature ``i + Dh/2``), so their checkpoints load without
    permuting the query and key projections.
    """
    half = x.shape[-1] // 2
    angles = positions.astype(jnp.float32)[..., None] * jnp.asarray(
        inverse_frequency
    )  # [B, T, half]
    sin = jnp.sin(angles)[:, :, None, :]
    cos = jnp.cos(angles)[:, :, None, :]
    x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x.dtype)


def _attend(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    query_slots: jax.Array,
    key_mask: jax.Array,
    *,
    scale: float,
    window: int | None = None,
) -> jax.Array:
    """Causal masked grouped-query attention, shared by the full forward and the cached decode.

    Args:
      query: [B, T, H, Dh] queries, already rotated.
      key, value: [B, KV, S, Dh] with KV dividing H; query head ``h`` reads kv head
        ``h // (H / KV)`` (the Hugging Face ``repeat_kv`` layout). Slot ``s`` of the
        key axis is slot ``s`` of the sequence.
      query_slots: [B, T] int32, the sequence slot of each query (causality: key slot <= query
        slot); per row, since rows of a cached decode may sit at different offsets.
      key_mask: [B, S] bool, False for padding keys that nobody may attend to; or int32
        segment ids (0 on padding) of a full forward, where a query attends only to keys of
        its own segment (several contexts packed in one row).
      scale: what the scores q.k are multiplied by before the softmax.
      window: a sliding layer's window: a query sees only keys less than ``window`` slots
        before it. Slots count positions, since a row's real tokens (of one segment) are
        contiguous in both the trainer's rows and the engine's cache. None: no limit.
    Returns:
      [B, T, H, Dh] attention output.
    """
    batch_size, length, num_heads, head_dim = query.shape
    num_kv_heads = key.shape[1]
    if length == 1 and not jnp.issubdtype(key_mask.dtype, jnp.integer):
        return _attend_one_query(query, key, value, query_slots, key_mask, scale=scale, window=window)
    grouped = query.reshape(batch_size, length, num_kv_heads, num_heads // num_kv_heads, head_dim)
    scores = (
        jnp.einsum("btkgd,bksd->bkgts", grouped.astype(jnp.float32), key.astype(jnp.float32))
        * scale
    )
    key_slots = jnp.arange(key.shape[2], dtype=jnp.int32)
    causal = key_slots[None, None, :] <= query_slots[:, :, None]  # [B, T, S]
    if window is not None:
        causal = causal & (key_slots[None, None, :] > query_slots[:, :, None] - window)
    if jnp.issubdtype(key_mask.dtype, jnp.integer):
        query_segments = jnp.take_along_axis(key_mask, query_slots, axis=1)  # [B, T]
        visible = (key_mask[:, None, :] == query_segments[:, :, None]) & (key_mask[:, None, :] > 0)
    else:
        visible = jnp.broadcast_to(key_mask[:, None, :], causal.shape)
    allowed = (causal & visible)[:, None, None, :, :]  # [B, 1, 1, T, S]
    scores = jnp.where(allowed, scores, _MASKED_SCORE)
    weights = jax.nn.softmax(scores, axis=-1)
    output = jnp.einsum("bkgts,bksd->btkgd", weights, value.astype(jnp.float32))
    return output.reshape(batch_size, length, num_heads, head_dim).astype(query.dtype)


def _attend_in_query_chunks(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    key_mask: jax.Array,
    *,
    scale: float,
    window: int | None,
    chunk: int,
) -> jax.Array:
    """:func:`_attend` of a full forward (query slot ``i`` is sequence slot ``i``), ``chunk`` queries at a time.

    Each chunk attends only to the keys that causality and the window leave it: those before its last
    slot, and for a sliding layer none ``window`` or more slots before its first. Keys left out would
    have had exactly zero weight (their masked score underflows), so real tokens get what the whole
    ``[T, T]`` attention gives them, up to float rounding. Each chunk is checkpointed: its backward pass
    recomputes its scores, so no more than one chunk's ``[chunk, keys]`` scores exist at once.
    """
    batch_size, length = query.shape[:2]
    attend = jax.checkpoint(functools.partial(_attend, scale=scale, window=window))
    outputs = []
    for start in range(0, length, chunk):
        end = min(start + chunk, length)
        first_key = 0 if window is None else max(0, start - window + 1)
        # Slots relative to the first key kept: causality and the window compare differences of slots.
        query_slots = jnp.broadcast_to(jnp.arange(start - first_key, end - first_key, dtype=jnp.int32),
                                       (batch_size, end - start))
        outputs.append(attend(query[:, start:end], key[:, :, first_key:end], value[:, :, first_key:end],
                              query_slots, key_mask[:, first_key:end]))
    return jnp.concatenate(outputs, axis=1)


def _attend_one_query(
    query: jax.Array,
    key: jax.Array,
    value: jax.Array,
    query_slots: jax.Array,
    key_mask: jax.Array,
    *,
    scale: float,
    window: int | None,
) -> jax.Array:
    """:func:`_attend` for one query per row (a decode step), the same arithmetic.

    Without the query axis of length 1 the two contractions are plain batched
    matrix-vector products, which XLA:CPU runs about a fifth faster than the
    general form over the whole cache of every layer (measured with
    SmolLM2-135M's 30 layers, 16 rows and 321 slots).
    """
    batch_size, _, num_heads, head_dim = query.shape
    num_kv_heads = key.shape[1]
    grouped = query.reshape(batch_size, num_kv_heads, num_heads // num_kv_heads, head_dim)
    scores = jnp.einsum(
        "bkgd,bksd->bkgs", grouped.astype(jnp.float32), key.astype(jnp.float32)
    ) * scale
    key_slots = jnp.arange(key.shape[2], dtype=jnp.int32)
    allowed = (key_slots[None, :] <= query_slots[:, :1]) & key_mask  # [B, S]
    if window is not None:
        allowed = allowed & (key_slots[None, :] > query_slots[:, :1] - window)
    scores = jnp.where(allowed[:, None, None, :], scores, _MASKED_SCORE)
    weights = jax.nn.softmax(scores, axis=-1)
    output = jnp.einsum("bkgs,bksd->bkgd", weights, value.astype(jnp.float32))
    return output.reshape(batch_size, 1, num_heads, head_dim).astype(query.dtype)


def _write_rows(cache: jax.Array, new: jax.Array, offsets: jax.Array) -> jax.Array:
    """Write ``new`` [B, KV, T, Dh] into ``cache`` [B, KV, L, Dh] at slot ``offsets[b]`` of row b."""

    def write_row(row_cache: jax.Array, row_new: jax.Array, offset: jax.Array) -> jax.Array:
        start = (0, offset, 0)
        return jax.lax.dynamic_update_slice(row_cache, row_new.astype(row_cache.dtype), start)

    return jax.vmap(write_row)(cache, new, offsets)


def _per_token(layer: nnx.Module, x: jax.Array) -> jax.Array:
    """``layer`` applied to every token of ``x`` [..., features], as one 2D matmul over tokens.

    The same numbers as calling it on ``x`` directly, but faster to train on
    CPU: XLA differentiates a matmul over [B, T, d] inputs into transposed
    copies of the [B, T, hidden] activations that cost more than the matmuls
    themselves, while over [B * T, d] the weight gradient is one plain matmul.
    """
    return layer(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], -1)


def _rms_norm(features: int, config: TransformerConfig, rngs: nnx.Rngs) -> nnx.RMSNorm:
    return nnx.RMSNorm(
        features,
        epsilon=config.rms_norm_eps,
        dtype=config.dtype,
        param_dtype=config.dtype,
        rngs=rngs,
    )


def _linear(
    in_features: int, out_features: int, config: TransformerConfig, rngs: nnx.Rngs, *, bias: bool
) -> nnx.Linear:
    return nnx.Linear(
        in_features,
        out_features,
        use_bias=bias,
        dtype=config.dtype,
        param_dtype=config.dtype,
        rngs=rngs,
    )


class Attention(nnx.Module):
    """Grouped-query self-attention with rotary positions and an optional KV cache.

    ``query_norm`` and ``key_norm`` exist only with ``config.qk_norm`` (None otherwise).
    Layer ``layer_index`` is full or sliding as ``config.layer_attention`` says; a
    sliding one has its own rotary base when ``config.sliding_rope_theta`` is set.
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, layer_index: int = 0):
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        sliding = config.attention_of_layer(layer_index) == "sliding"
        self.window = config.sliding_window if sliding else None
        if sliding and config.sliding_rope_theta is not None:
            self.rope_theta, self.rope_scaling = config.sliding_rope_theta, None
        else:
            self.rope_theta, self.rope_scaling = config.rope_theta, config.rope_scaling
        self.scale = (config.query_pre_attention_scalar or config.head_dim) ** -0.5
        query_width = config.num_heads * config.head_dim
        kv_width = config.num_kv_heads * config.head_dim
        self.query = _linear(config.d_model, query_width, config, rngs, bias=config.qkv_bias)
        self.key = _linear(config.d_model, kv_width, config, rngs, bias=config.qkv_bias)
        self.value = _linear(config.d_model, kv_width, config, rngs, bias=config.qkv_bias)
        self.output = _linear(query_width, config.d_model, config, rngs, bias=False)
        if config.qk_norm:
            self.query_norm = _rms_norm(config.head_dim, config, rngs)
            self.key_norm = _rms_norm(config.head_dim, config, rngs)
        else:
            self.query_norm = None
            self.key_norm = None

    def __call__(
        self,
        x: jax.Array,
        positions: jax.Array,
        key_mask: jax.Array,
        layer_cache: dict[str, jax.Array] | None = None,
        cache_index: jax.Array | None = None,
        *,
        query_chunk: int | None = None,
    ) -> tuple[jax.Array, dict[str, jax.Array] | None]:
        batch_size, length, _ = x.shape
        query = _per_token(self.query, x).reshape(batch_size, length, self.num_heads, self.head_dim)
        key = _per_token(self.key, x).reshape(batch_size, length, self.num_kv_heads, self.head_dim)
        value = _per_token(self.value, x).reshape(
            batch_size, length, self.num_kv_heads, self.head_dim
        )
        if self.query_norm is not None:
            query = self.query_norm(query)
            key = self.key_norm(key)
        inverse_frequency = _inverse_frequencies(self.head_dim, self.rope_theta, self.rope_scaling)
        query = _apply_rotary(query, positions, inverse_frequency)
        key = _apply_rotary(key, positions, inverse_frequency)

        steps = jnp.arange(length, dtype=jnp.int32)
        key, value = key.transpose(0, 2, 1, 3), value.transpose(0, 2, 1, 3)  # see KVCache
        if layer_cache is None and query_chunk is not None and length > query_chunk:
            attended = _attend_in_query_chunks(query, key, value, key_mask, scale=self.scale, window=self.window,
                                               chunk=query_chunk)
            new_cache = None
        elif layer_cache is None:
            query_slots = jnp.broadcast_to(steps, (batch_size, length))
            new_cache = None
            attended = _attend(query, key, value, query_slots, key_mask, scale=self.scale, window=self.window)
        else:
            # cache_index is [B] here (Transformer.decode broadcasts a scalar).
            key = _write_rows(layer_cache["key"], key, cache_index)
            value = _write_rows(layer_cache["value"], value, cache_index)
            query_slots = cache_index[:, None] + steps[None, :]
            new_cache = {"key": key, "value": value}
            attended = _attend(query, key, value, query_slots, key_mask, scale=self.scale, window=self.window)
        return _per_token(self.output, attended.reshape(batch_size, length, -1)), new_cache


#: The gates of :class:`MLP`; ``gelu_tanh`` is ``transformers``' ``gelu_pytorch_tanh``.
_MLP_GATES: dict[MlpActivation, Callable[[jax.Array], jax.Array]] = {
    "silu": jax.nn.silu,
    "gelu_tanh": functools.partial(jax.nn.gelu, approximate=True),
}


class MLP(nnx.Module):
    """Gated feed-forward block (Shazeer, 2020): SwiGLU as in Llama and Qwen, GeGLU as in Gemma."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.activation = config.mlp_activation
        self.gate = _linear(config.d_model, config.mlp_dim, config, rngs, bias=False)
        self.up = _linear(config.d_model, config.mlp_dim, config, rngs, bias=False)
        self.down = _linear(config.mlp_dim, config.d_model, config, rngs, bias=False)

    def __call__(self, x: jax.Array) -> jax.Array:
        tokens = x.reshape(-1, x.shape[-1])  # see _per_token
        hidden = _MLP_GATES[self.activation](self.gate(tokens)) * self.up(tokens)
        return self.down(hidden).reshape(x.shape)


class Block(nnx.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x)).

    With ``config.post_sublayer_norms`` each sublayer's output is normed once more before
    the residual sum: x + norm(attn(norm(x))), then x + norm(mlp(norm(x))) (Gemma 2 and 3);
    ``post_attention_norm`` and ``post_mlp_norm`` are None otherwise.
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, layer_index: int = 0):
        self.attention_norm = _rms_norm(config.d_model, config, rngs)
        self.attention = Attention(config, rngs=rngs, layer_index=layer_index)
        self.mlp_norm = _rms_norm(config.d_model, config, rngs)
        self.mlp = MLP(config, rngs=rngs)
        sandwich = config.post_sublayer_norms
        self.post_attention_norm = _rms_norm(config.d_model, config, rngs) if sandwich else None
        self.post_mlp_norm = _rms_norm(config.d_model, config, rngs) if sandwich else None

    def __call__(
        self,
        x: jax.Array,
        positions: jax.Array,
        key_mask: jax.Array,
        layer_cache: dict[str, jax.Array] | None = None,
        cache_index: jax.Array | None = None,
        *,
        query_chunk: int | None = None,
    ) -> tuple[jax.Array, dict[str, jax.Array] | None]:
        attended, new_cache = self.attention(
            self.attention_norm(x), positions, key_mask, layer_cache, cache_index, query_chunk=query_chunk
        )
        if self.post_attention_norm is not None:
            attended = self.post_attention_norm(attended)
        x = x + attended
        transformed = self.mlp(self.mlp_norm(x))
        if self.post_mlp_norm is not None:
            transformed = self.post_mlp_norm(transformed)
        x = x + transformed
        return x, new_cache


#: What a backward pass keeps of each block's forward (activation checkpointing, per layer):
#: ``none`` everything (fastest, most memory); ``full`` only the block's input, recomputing the rest
#: (about one more forward pass; activations of one block at a time); ``save_matmuls`` the matmul
#: outputs, recomputing the cheap element-wise work between them (norms, rotary, softmax, activations).
REMAT_POLICIES: dict[RematPolicy, Callable | None] = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "save_matmuls": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}
if set(REMAT_POLICIES) != set(get_args(RematPolicy)):
    raise AssertionError("every remat policy of the config needs JAX's, and only those")


def _rematerialised_block(block: Block, x: jax.Array, positions: jax.Array, attention_mask: jax.Array,
                          remat: RematPolicy, query_chunk: int | None) -> jax.Array:
    """``block``'s output, of which a gradient keeps only what ``remat`` saves and recomputes the rest.

    ``jax.checkpoint`` alone relies on optimization barriers to keep XLA from merging the backward
    pass's recomputation back into the forward pass, and XLA's CPU backend does not keep them: there
    a checkpointed block held every activation, as the plain one does (the small preset's gradient at
    4 x 512 tokens: 1,152 MiB of temporaries without remat, 1,088 with ``full``). On CPU, the block's
    backward pass therefore runs inside a conditional, across whose boundary XLA merges nothing
    (174 MiB with ``full``).
    """
    graphdef, state = nnx.split(block)

    def run_block(state: nnx.State, x: jax.Array) -> jax.Array:
        return nnx.merge(graphdef, state)(x, positions, attention_mask, query_chunk=query_chunk)[0]

    checkpointed = jax.checkpoint(run_block, policy=REMAT_POLICIES[remat])
    if jax.default_backend() == "cpu":
        checkpointed = _backward_in_a_conditional(checkpointed)
    return checkpointed(state, x)


def _backward_in_a_conditional(function: Callable[[Any, jax.Array], jax.Array]) -> Callable:
    """``function(params, x)`` as is, with its backward pass run in a conditional of two equal branches."""

    @jax.custom_vjp
    def wrapped(params: Any, x: jax.Array) -> jax.Array:
        return function(params, x)

    def forward(params: Any, x: jax.Array):
        # The pullback of a checkpointed function holds only what its policy saves.
        return jax.vjp(function, params, x)

    def backward(pullback, cotangent: jax.Array):
        # A predicate XLA cannot fold (a NaN is unequal to itself); either branch computes the same.
        probe = cotangent.reshape(-1)[0]
        return jax.lax.cond(probe == probe, pullback, pullback, cotangent)

    wrapped.defvjp(forward, backward)
    return wrapped


class Transformer(nnx.Module):
    """Decoder-only policy: token embedding, pre-norm blocks, final RMSNorm, output head.

    By default the head is untied from the embedding so that, at
    initialization, logits have unit scale (the embedding has unit-variance
    rows, which a tied head would turn into logits of scale sqrt(d_model) and
    a near-deterministic initial policy). With ``tie_embeddings`` the head is
    ``None``, logits are ``embedding.attend(h)``, and the embedding starts at
    a 1/sqrt(d_model) scale for the same reason.
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.config = config
        tied_init = {"embedding_init": nnx.initializers.normal(stddev=config.d_model**-0.5)}
        self.embedding = nnx.Embed(
            config.vocab_size,
            config.d_model,
            dtype=config.dtype,
            param_dtype=config.dtype,
            rngs=rngs,
            **(tied_init if config.tie_embeddings else {}),
        )
        self.blocks = nnx.List([Block(config, rngs=rngs, layer_index=index) for index in range(config.num_layers)])
        self.final_norm = _rms_norm(config.d_model, config, rngs)
        self.head = (
            None
            if config.tie_embeddings
            else _linear(config.d_model, config.vocab_size, config, rngs, bias=False)
        )

    def hidden_states(
        self, tokens: jax.Array, positions: jax.Array, attention_mask: jax.Array, *, remat: RematPolicy = "none",
        query_chunk: int | None = None,
    ) -> jax.Array:
        """Full-sequence causal forward up to the final norm.

        Args:
          tokens: int32 [B, T].
          positions: int32 [B, T], rotary positions (0 at each row's first real token).
          attention_mask: bool [B, T], False on padding, left or right; or int32 segment
            ids [B, T] (0 on padding): tokens attend only within their segment.
          remat: what a gradient through it keeps of each block (:data:`REMAT_POLICIES`).
          query_chunk: a row longer than this attends this many queries at a time
            (:func:`_attend_in_query_chunks`); None: every row attends whole.
        Returns:
          float32 [B, T, d_model] final-normed hidden states, the input of the head
          (and of any value head built on the policy).
        """
        x = self.embed(tokens)
        for block in self.blocks:
            if remat == "none":
                x = block(x, positions, attention_mask, query_chunk=query_chunk)[0]
            else:
                x = _rematerialised_block(block, x, positions, attention_mask, remat, query_chunk)
        return self.final_norm(x).astype(jnp.float32)

    def __call__(
        self, tokens: jax.Array, positions: jax.Array, attention_mask: jax.Array
    ) -> jax.Array:
        """Full-sequence causal forward; arguments as :meth:`hidden_states`.

        Returns:
          float32 [B, T, V] logits; the logits at slot t predict the token at slot t + 1.
        """
        return self.logits(self.hidden_states(tokens, positions, attention_mask))

    def embed(self, tokens: jax.Array) -> jax.Array:
        """The residual stream's input [..., d_model] for int32 ``tokens`` [...]."""
        x = self.embedding(tokens)
        if self.config.scale_embeddings:
            # Rounded to the parameter dtype first, as transformers' Gemma does.
            x = x * jnp.asarray(self.config.d_model**0.5, self.config.dtype)
        return x

    def logits(self, hidden: jax.Array) -> jax.Array:
        """float32 [..., V] logits of final-normed hidden states [..., d_model]."""
        hidden = hidden.astype(self.config.dtype)
        if self.head is None:
            return _per_token(self.embedding.attend, hidden).astype(jnp.float32)
        return _per_token(self.head, hidden).astype(jnp.float32)

    def init_cache(self, batch_size: int, cache_len: int, dtype: Any = jnp.float32) -> KVCache:
        """An empty cache: one key and one value array [B, KV, cache_len, Dh] per layer."""
        shape = (batch_size, self.config.num_kv_heads, cache_len, self.config.head_dim)
        return [
            {"key": jnp.zeros(shape, dtype), "value": jnp.zeros(shape, dtype)}
            for _ in range(self.config.num_layers)
        ]

    def decode(
        self,
        tokens: jax.Array,
        positions: jax.Array,
        cache: KVCache,
        cache_index: jax.Array,
        key_mask: jax.Array,
        logits_at: jax.Array | None = None,
    ) -> tuple[jax.Array, KVCache]:
        """Run T new tokens against the cache, functionally.

        The new keys and values of row ``b`` are written at slots
        ``cache_index[b] .. cache_index[b] + T - 1`` of that row (a scalar
        ``cache_index`` is the same offset for every row); each new token
        attends to all cache slots of its row up to its own, minus those where
        ``key_mask`` is False. Prefill is a call with the whole (left-padded)
        prompt at ``cache_index=0``. Writes must fit: ``cache_index[b] + T <=
        cache_len`` (``dynamic_update_slice`` would otherwise clamp the start).

        Args:
          tokens: int32 [B, T].
          positions: int32 [B, T] rotary positions of the new tokens.
          cache: from :meth:`init_cache` or a previous call.
          cache_index: int32 scalar or [B], the slot of ``tokens[:, 0]`` (per row when a
            vector); may be traced.
          key_mask: bool [B, cache_len], False on padding slots.
          logits_at: int32 [B], optional: the one position of each row whose logits are wanted
            (a prefill's last prompt token). The LM head then runs on B hidden states instead of
            B x T: at a vocabulary of 262k, a prefill window's full logits outgrow the KV cache.
        Returns:
          (float32 [B, T, V] logits, or [B, 1, V] with ``logits_at``; updated cache).
        """
        cache_index = jnp.broadcast_to(jnp.asarray(cache_index, jnp.int32), tokens.shape[:1])
        x = self.embed(tokens)
        new_cache: KVCache = []
        for block, layer_cache in zip(self.blocks, cache, strict=True):
            x, updated = block(x, positions, key_mask, layer_cache, cache_index)
            new_cache.append(updated)
        if logits_at is not None:
            x = jnp.take_along_axis(x, logits_at[:, None, None], axis=1)
        return self.logits(self.final_norm(x)), new_cache


def split_model(model: Transformer) -> tuple[nnx.GraphDef, nnx.State]:
    """Split a model into its static structure and its parameters.

    Everyone (sampler, train step, weight publisher, checkpoints) uses this
    one split, ``nnx.split(model, nnx.Param)``, so a ``params`` State from any
    of them can be merged with any ``graphdef``. The filter is exhaustive on
    purpose: if a module ever grows non-parameter state, this raises instead
    of silently dropping it.
    """
    graphdef, params = nnx.split(model, nnx.Param)
    return graphdef, params


def count_parameters(model: Transformer) -> int:
    """Total number of scalar parameters."""
    return sum(leaf.size for leaf in jax.tree.leaves(nnx.state(model, nnx.Param)))
