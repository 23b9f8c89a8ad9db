"""PPO's critic: a linear value head on the policy's final hidden states.

The head lives in the same module tree as the policy, in
:class:`PolicyWithValue`, so one ``split_model`` gives one ``params`` State
holding both (``params["policy"]`` and ``params["value_head"]``), one
optimizer updates both, and the train step differentiates the merged model
it is given without knowing that a critic exists. Producers only ever see
the policy: publish :func:`policy_params` of the state, never all of it.

The policy must offer ``hidden_states(tokens, positions, attention_mask)``
(float32 [B, T, D], after the final norm) and ``logits(hidden)`` (its
output projection, tied or not), with ``policy(...) ==
logits(hidden_states(...))``; :class:`policy.model.Transformer` does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


class ValueHead(nnx.Module):
    """``V(s_t) = w . h_t + b`` over final hidden states [B, T, D] -> [B, T].

    Initialised to zero, so the first values are 0 everywhere: the first
    advantages are plain discounted returns instead of noise from a random
    projection.
    """

    def __init__(self, d_model: int, *, rngs: nnx.Rngs):
        self.projection = nnx.Linear(
            d_model, 1, kernel_init=nnx.initializers.zeros_init(), rngs=rngs
        )

    def __call__(self, hidden_states: jax.Array) -> jax.Array:
        return self.projection(hidden_states.astype(jnp.float32))[..., 0]


class PolicyWithValue(nnx.Module):
    """A policy and its value head, trained as one model.

    ``model(tokens, positions, attention_mask)`` returns the policy's logits,
    exactly as the bare policy would, so anything that takes logits works
    unchanged; :meth:`values` and :meth:`logits_and_values` add the critic.
    ``values[:, t]`` scores the state after slot ``t``, the one whose logits
    (at slot ``t``) pick the token at slot ``t + 1``.
    """

    def __init__(self, policy: nnx.Module, value_head: ValueHead):
        self.policy = policy
        self.value_head = value_head

    def __call__(
        self, tokens: jax.Array, positions: jax.Array, attention_mask: jax.Array
    ) -> jax.Array:
        return self.policy(tokens, positions, attention_mask)

    def hidden_states(self, tokens: jax.Array, positions: jax.Array, attention_mask: jax.Array, *,
                      remat: str = "none", query_chunk: int | None = None) -> jax.Array:
        """The policy's final-normed hidden states [B, T, D], the input of its head and of the critic."""
        return self.policy.hidden_states(tokens, positions, attention_mask, remat=remat, query_chunk=query_chunk)

    def logits(self, hidden: jax.Array) -> jax.Array:
        """The policy's logits of ``hidden``."""
        return self.policy.logits(hidden)

    def values(
        self, tokens: jax.Array, positions: jax.Array, attention_mask: jax.Array
    ) -> jax.Array:
        """float32 [B, T] state values."""
        return self.value_head(self.policy.hidden_states(tokens, positions, attention_mask))

    def logits_and_values(
        self, tokens: jax.Array, positions: jax.Array, attention_mask: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """(float32 [B, T, V] logits, float32 [B, T] values) from one forward pass."""
        hidden = self.policy.hidden_states(tokens, positions, attention_mask)
        return self.policy.logits(hidden), self.value_head(hidden)


def with_value_head(policy: nnx.Module, *, d_model: int, rngs: nnx.Rngs) -> PolicyWithValue:
    """Wrap ``policy`` with a fresh zero-initialised value head of width ``d_model``."""
    return PolicyWithValue(policy, ValueHead(d_model, rngs=rngs))


def policy_params(params: nnx.State) -> nnx.State:
    """The policy's part of a :class:`PolicyWithValue`'s params, as producers load them.

    The result has exactly the structure of ``split_model(policy)[1]``, so it
    can be published, sampled with, or merged with the bare policy's graphdef.
    """
    return params["policy"]
