"""The decoder-only transformer policy, with a functional KV cache for sampling.

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
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from tandem.run_config import ModelConfig

# A per-layer list of {"key": [B, L, H, Dh], "value": [B, L, H, Dh]} arrays.
KVCache = list[dict[str, jax.Array]]

# Added to the scores of keys a query must not see. Finite (see module doc).
_MASKED_SCORE = -1e9
# Base wavelength of the rotary embedding, as in RoFormer and Llama.
_ROPE_BASE = 10_000.0


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Static shape of the policy; hashable, so it can key compiled functions."""

    # Number of token ids the embedding and the output head cover.
    vocab_size: int
    # Width of the residual stream.
    d_model: int
    # Number of transformer blocks.
    num_layers: int
    # Attention heads; must divide d_model, and d_model / num_heads must be even (rotary).
    num_heads: int
    # Hidden width of each SwiGLU MLP.
    mlp_dim: int
    # Longest sequence (prompt plus generation) the policy is asked to handle.
    max_seq_len: int

    def __post_init__(self) -> None:
        if self.d_model % self.num_heads:
            raise ValueError(f"num_heads={self.num_heads} must divide d_model={self.d_model}")
        if self.head_dim % 2:
            raise ValueError(
                f"head dimension d_model/num_heads={self.head_dim} must be even for rotary embeddings"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads

    @classmethod
    def from_model_config(cls, model_config: ModelConfig, vocab_size: int) -> TransformerConfig:
        """The run config leaves the vocabulary to the tokenizer, so it is passed separately."""
        return cls(
            vocab_size=vocab_size,
            d_model=model_config.d_model,
            num_layers=model_config.num_layers,
            num_heads=model_config.num_heads,
            mlp_dim=model_config.mlp_dim,
            max_seq_len=model_config.max_seq_len,
        )


def _apply_rotary(x: jax.Array, positions: jax.Array) -> jax.Array:
    """Rotate pairs of features of ``x`` [B, T, H, Dh] by angles set by ``positions`` [B, T].

    Uses the "rotate half" layout (first half of the features paired with the
    second half), which is equivalent to interleaved pairs up to a fixed
    permutation of the learned projections.
    """
    half = x.shape[-1] // 2
    inverse_frequency = _ROPE_BASE ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles = positions.astype(jnp.float32)[..., None] * inverse_frequency  # [B, T, half]
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
) -> jax.Array:
    """Causal masked attention shared by the full forward pass and the cached decode.

    Args:
      query: [B, T, H, Dh] queries, already rotated.
      key, value: [B, S, H, Dh]; slot ``s`` of the key axis is slot ``s`` of the sequence.
      query_slots: [T] int32, the sequence slot of each query (causality: key slot <= query slot).
      key_mask: [B, S] bool, False for padding keys that nobody may attend to.
    Returns:
      [B, T, H, Dh] attention output.
    """
    scale = query.shape[-1] ** -0.5
    scores = (
        jnp.einsum("bthd,bshd->bhts", query.astype(jnp.float32), key.astype(jnp.float32)) * scale
    )
    key_slots = jnp.arange(key.shape[1], dtype=jnp.int32)
    causal = key_slots[None, :] <= query_slots[:, None]  # [T, S]
    allowed = causal[None, None, :, :] & key_mask[:, None, None, :]  # [B, 1, T, S]
    scores = jnp.where(allowed, scores, _MASKED_SCORE)
    weights = jax.nn.softmax(scores, axis=-1)
    output = jnp.einsum("bhts,bshd->bthd", weights, value.astype(jnp.float32))
    return output.astype(query.dtype)


class Attention(nnx.Module):
    """Multi-head self-attention with rotary positions and an optional KV cache."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.num_heads = config.num_heads
        self.head_dim = config.head_dim
        projection = dict(use_bias=False, rngs=rngs)
        self.query = nnx.Linear(config.d_model, config.d_model, **projection)
        self.key = nnx.Linear(config.d_model, config.d_model, **projection)
        self.value = nnx.Linear(config.d_model, config.d_model, **projection)
        self.output = nnx.Linear(config.d_model, config.d_model, **projection)

    def _heads(self, x: jax.Array) -> jax.Array:
        return x.reshape(*x.shape[:-1], self.num_heads, self.head_dim)

    def __call__(
        self,
        x: jax.Array,
        positions: jax.Array,
        key_mask: jax.Array,
        layer_cache: dict[str, jax.Array] | None = None,
        cache_index: jax.Array | None = None,
    ) -> tuple[jax.Array, dict[str, jax.Array] | None]:
        batch_size, length, _ = x.shape
        query = _apply_rotary(self._heads(self.query(x)), positions)
        key = _apply_rotary(self._heads(self.key(x)), positions)
        value = self._heads(self.value(x))

        if layer_cache is None:
            query_slots = jnp.arange(length, dtype=jnp.int32)
            new_cache = None
        else:
            start = (0, cache_index, 0, 0)
            key = jax.lax.dynamic_update_slice(
                layer_cache["key"], key.astype(layer_cache["key"].dtype), start
            )
            value = jax.lax.dynamic_update_slice(
                layer_cache["value"], value.astype(layer_cache["value"].dtype), start
            )
            query_slots = cache_index + jnp.arange(length, dtype=jnp.int32)
            new_cache = {"key": key, "value": value}

        attended = _attend(query, key, value, query_slots, key_mask)
        return self.output(attended.reshape(batch_size, length, -1)), new_cache


class MLP(nnx.Module):
    """SwiGLU feed-forward block (Shazeer, 2020), as in Llama and Gemma."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.gate = nnx.Linear(config.d_model, config.mlp_dim, use_bias=False, rngs=rngs)
        self.up = nnx.Linear(config.d_model, config.mlp_dim, use_bias=False, rngs=rngs)
        self.down = nnx.Linear(config.mlp_dim, config.d_model, use_bias=False, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.down(jax.nn.silu(self.gate(x)) * self.up(x))


class Block(nnx.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.attention_norm = nnx.RMSNorm(config.d_model, rngs=rngs)
        self.attention = Attention(config, rngs=rngs)
        self.mlp_norm = nnx.RMSNorm(config.d_model, rngs=rngs)
        self.mlp = MLP(config, rngs=rngs)

    def __call__(
        self,
        x: jax.Array,
        positions: jax.Array,
        key_mask: jax.Array,
        layer_cache: dict[str, jax.Array] | None = None,
        cache_index: jax.Array | None = None,
    ) -> tuple[jax.Array, dict[str, jax.Array] | None]:
        attended, new_cache = self.attention(
            self.attention_norm(x), positions, key_mask, layer_cache, cache_index
        )
        x = x + attended
        x = x + self.mlp(self.mlp_norm(x))
        return x, new_cache


class Transformer(nnx.Module):
    """Decoder-only policy: token embedding, pre-norm blocks, final RMSNorm, untied head.

    The head is untied from the embedding so that, at initialization, logits
    have unit scale (the embedding has unit-variance rows, which a tied head
    would turn into logits of scale sqrt(d_model) and a near-deterministic
    initial policy).
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.embedding = nnx.Embed(config.vocab_size, config.d_model, rngs=rngs)
        self.blocks = nnx.List([Block(config, rngs=rngs) for _ in range(config.num_layers)])
        self.final_norm = nnx.RMSNorm(config.d_model, rngs=rngs)
        self.head = nnx.Linear(config.d_model, config.vocab_size, use_bias=False, rngs=rngs)

    def __call__(
        self, tokens: jax.Array, positions: jax.Array, attention_mask: jax.Array
    ) -> jax.Array:
        """Full-sequence causal forward.

        Args:
          tokens: int32 [B, T].
          positions: int32 [B, T], rotary positions (0 at each row's first real token).
          attention_mask: bool [B, T], False on padding, left or right.
        Returns:
          float32 [B, T, V] logits; the logits at slot t predict the token at slot t + 1.
        """
        x = self.embedding(tokens)
        for block in self.blocks:
            x, _ = block(x, positions, attention_mask)
        return self._logits(x)

    def init_cache(self, batch_size: int, cache_len: int, dtype: Any = jnp.float32) -> KVCache:
        """An empty cache: one key and one value array [B, cache_len, H, Dh] per layer."""
        shape = (batch_size, cache_len, self.config.num_heads, self.config.head_dim)
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
    ) -> tuple[jax.Array, KVCache]:
        """Run T new tokens against the cache, functionally.

        The new keys and values are written at slots ``cache_index ..
        cache_index + T - 1``; each new token attends to all cache slots up to
        its own, minus those where ``key_mask`` is False. Prefill is a call
        with the whole (left-padded) prompt at ``cache_index=0``.

        Args:
          tokens: int32 [B, T].
          positions: int32 [B, T] rotary positions of the new tokens.
          cache: from :meth:`init_cache` or a previous call.
          cache_index: int32 scalar, the slot of ``tokens[:, 0]``; may be traced.
          key_mask: bool [B, cache_len], False on padding slots.
        Returns:
          (float32 [B, T, V] logits, updated cache).
        """
        cache_index = jnp.asarray(cache_index, jnp.int32)
        x = self.embedding(tokens)
        new_cache: KVCache = []
        for block, layer_cache in zip(self.blocks, cache, strict=True):
            x, updated = block(x, positions, key_mask, layer_cache, cache_index)
            new_cache.append(updated)
        return self._logits(x), new_cache

    def _logits(self, x: jax.Array) -> jax.Array:
        return self.head(self.final_norm(x)).astype(jnp.float32)


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
