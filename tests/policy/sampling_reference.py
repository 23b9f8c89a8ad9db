"""The small policy the inference engine and the batch sampler are tested on, and their reference.

The reference is a full forward pass of a whole sequence, right-padded to
``max_seq_len`` as in training. Log-probability comparisons use an absolute
tolerance of 1e-4 (float32; the cached decode, the offset prefill and the
full forward pass sum in different orders).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from policy.model import Transformer, TransformerConfig, split_model
from policy.tokenizer import BOS_ID, PAD_ID, VOCAB_SIZE

TOLERANCE = 1e-4

CONFIG = TransformerConfig(
    vocab_size=VOCAB_SIZE, d_model=32, num_layers=2, num_heads=2, mlp_dim=64, max_seq_len=64
)
NUM_SLOTS = 4
CHUNK = 4


def full_forward_logprobs(model: Transformer) -> Callable[[nnx.State, list[int], float], np.ndarray]:
    """``compute(params, sequence, temperature)``: tempered log-probs [len - 1, V] of every next token.

    Right-padded to max_seq_len as in training, and jitted once.
    """
    graphdef = split_model(model)[0]

    @jax.jit
    def tempered(params, tokens, mask, temperature):
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
        logits = nnx.merge(graphdef, params)(tokens, positions, mask)
        return jax.nn.log_softmax(logits / temperature, axis=-1)

    def compute(params, sequence: list[int], temperature: float) -> np.ndarray:
        tokens = np.full((1, CONFIG.max_seq_len), PAD_ID, np.int32)
        tokens[0, : len(sequence)] = sequence
        mask = np.arange(CONFIG.max_seq_len)[None] < len(sequence)
        return np.asarray(tempered(params, tokens, mask, np.float32(temperature)))[
            0, : len(sequence) - 1
        ]

    return compute


def token_logprobs(all_logprobs: np.ndarray, sequence: list[int]) -> np.ndarray:
    """The log-prob of each next token of ``sequence``, from :func:`full_forward_logprobs`' rows."""
    return all_logprobs[np.arange(len(sequence) - 1), sequence[1:]]


def random_tokens(seed: int, length: int) -> list[int]:
    """BOS and ``length - 1`` random bytes."""
    return [BOS_ID, *np.random.default_rng(seed).integers(0, 256, length - 1).tolist()]
