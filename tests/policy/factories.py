"""Model factories shared by the trainer tests."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from policy.model import Transformer, TransformerConfig, split_model

# Whole forward / decode calls compiled at once: far cheaper than op-by-op
# dispatch, which compiles every primitive for every new shape.
forward = nnx.jit(lambda model, tokens, positions, mask: model(tokens, positions, mask))
decode = nnx.jit(lambda model, *args: model.decode(*args))


def random_model(config: TransformerConfig, seed: int) -> Transformer:
    """A model with numpy-drawn weights: no compiled initializers (seconds per shape on CPU).

    Norm scales and biases are perturbed away from 1 and 0, so they matter.
    """
    graphdef, params = split_model(nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0))))
    rng = np.random.default_rng(seed)

    def draw(path, leaf):
        name = path[-1].key
        if name == "scale":
            value = 1 + 0.2 * rng.standard_normal(leaf.shape)
        elif name == "bias":
            value = 0.5 * rng.standard_normal(leaf.shape)
        elif name == "embedding":
            value = rng.standard_normal(leaf.shape)
        else:
            value = rng.standard_normal(leaf.shape) / np.sqrt(leaf.shape[0])
        return jnp.asarray(value, leaf.dtype)

    nnx.replace_by_pure_dict(params, jax.tree.map_with_path(draw, nnx.to_pure_dict(params)))
    return nnx.merge(graphdef, params)
