"""Batched autoregressive sampling with a KV cache, compiled once per shape bucket.

Producers call :meth:`Sampler.generate` for every agent turn, with prompts of
every length and batches of every size. To keep XLA from recompiling, shapes
are padded to a few buckets:

- batch: the next entry of ``batch_buckets`` (extra rows are dummies);
- prompt: the next entry of ``prompt_buckets``, with buckets above
  ``max_seq_len`` replaced by ``max_seq_len`` itself; prompts are LEFT-padded
  so every row's last prompt token sits in the same slot and generation
  proceeds in lockstep;
- new tokens: the next power of two, at least 8. ``max_new_tokens`` itself,
  the temperature and the seed are traced values, so changing them does not
  recompile either.

Prefill and the whole decode loop run in one jitted function (a
``lax.while_loop`` that exits early once every row has produced EOS), so
there is no Python round trip per token.
"""

from __future__ import annotations

import bisect
import dataclasses
import threading
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from trainer.model import Transformer, TransformerConfig

# Smallest bucket of generated tokens; avoids one compilation per tiny max_new_tokens.
_MIN_NEW_TOKEN_BUCKET = 8


@dataclasses.dataclass(frozen=True)
class Completion:
    """What the policy generated for one prompt.

    ``token_ids`` ends with EOS when ``finished`` is True (nothing after EOS is
    kept). ``logprobs[i]`` is the log-probability of ``token_ids[i]`` under the
    temperature-scaled distribution it was actually sampled from, i.e. the
    behaviour policy of an importance ratio.
    """

    token_ids: list[int]
    logprobs: list[float]
    finished: bool


def _bucket(size: int, buckets: Sequence[int]) -> int:
    """Smallest bucket >= size; callers have checked that one exists."""
    return buckets[bisect.bisect_left(buckets, size)]


def _new_token_bucket(max_new_tokens: int) -> int:
    return max(_MIN_NEW_TOKEN_BUCKET, 1 << (max_new_tokens - 1).bit_length())


class Sampler:
    """Generates completions for a batch of prompts with given parameters.

    ``graphdef`` and ``params`` are the two halves of
    :func:`trainer.model.split_model` (``nnx.split(model, nnx.Param)``).
    Parameters are an argument of every call, not captured, so a producer can
    swap in newly published weights without recompiling, as long as their
    shapes and dtypes do not change.

    Prompts longer than the policy can handle are refused, not truncated:
    ``generate`` raises ValueError when ``len(prompt) + max_new_tokens >
    max_seq_len``, since silently dropping the start of a conversation (the
    task statement) would hand the trainer an episode the policy never saw.

    One call runs at a time (a lock guards it), so the sampler may be shared
    by coroutines that call it through ``asyncio.to_thread``.
    """

    def __init__(
        self,
        graphdef: nnx.GraphDef[Transformer],
        *,
        config: TransformerConfig,
        eos_id: int,
        pad_id: int,
        batch_buckets: Sequence[int] = (1, 2, 4, 8, 16, 32, 64),
        prompt_buckets: Sequence[int] = (32, 64, 128, 256),
    ):
        if not batch_buckets or not prompt_buckets:
            raise ValueError("batch_buckets and prompt_buckets must not be empty")
        self._graphdef = graphdef
        self._config = config
        self._eos_id = eos_id
        self._pad_id = pad_id
        self._batch_buckets = tuple(sorted(set(batch_buckets)))
        # No prompt bucket beyond what the policy can handle; max_seq_len is the last resort.
        self._prompt_buckets = tuple(
            sorted(
                {min(bucket, config.max_seq_len) for bucket in prompt_buckets}
                | {config.max_seq_len}
            )
        )
        self._lock = threading.Lock()
        self._compile_count = 0
        self._generate_jit = jax.jit(self._generate_traced, static_argnames=("new_token_bucket",))

    @property
    def compile_count(self) -> int:
        """How many times the generate function has been traced (once per shape bucket)."""
        return self._compile_count

    def generate(
        self,
        params: nnx.State,
        prompts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        seed: int,
    ) -> list[Completion]:
        """Sample up to ``max_new_tokens`` tokens after each prompt, all prompts in one batch.

        More prompts than the largest batch bucket are split into chunks of
        that size. Rows are independent: a row's tokens depend on the seed,
        its position in the batch and its prompt, never on other prompts.
        """
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        if not temperature > 0:
            raise ValueError(f"temperature must be positive, got {temperature}")
        max_seq_len = self._config.max_seq_len
        for index, prompt in enumerate(prompts):
            if not prompt:
                raise ValueError(f"prompt {index} is empty; it needs at least one token (e.g. BOS)")
            if len(prompt) + max_new_tokens > max_seq_len:
                raise ValueError(
                    f"prompt {index} has {len(prompt)} tokens; with max_new_tokens="
                    f"{max_new_tokens} it exceeds the model's max_seq_len={max_seq_len}"
                )

        chunk_size = self._batch_buckets[-1]
        base_key = jax.random.key(seed)
        completions: list[Completion] = []
        with self._lock:
            for chunk_index, start in enumerate(range(0, len(prompts), chunk_size)):
                completions.extend(
                    self._generate_chunk(
                        params,
                        prompts[start : start + chunk_size],
                        max_new_tokens=max_new_tokens,
                        temperature=temperature,
                        rng_key=jax.random.fold_in(base_key, chunk_index),
                    )
                )
        return completions

    def _generate_chunk(
        self,
        params: nnx.State,
        prompts: list[list[int]],
        *,
        max_new_tokens: int,
        temperature: float,
        rng_key: jax.Array,
    ) -> list[Completion]:
        batch_size = _bucket(len(prompts), self._batch_buckets)
        prompt_len = _bucket(max(len(prompt) for prompt in prompts), self._prompt_buckets)

        prompt_tokens = np.full((batch_size, prompt_len), self._pad_id, np.int32)
        prompt_mask = np.zeros((batch_size, prompt_len), np.bool_)
        for row, prompt in enumerate(prompts):
            prompt_tokens[row, prompt_len - len(prompt) :] = prompt
            prompt_mask[row, prompt_len - len(prompt) :] = True

        tokens, logprobs = self._generate_jit(
            params,
            prompt_tokens,
            prompt_mask,
            rng_key,
            np.int32(max_new_tokens),
            np.float32(temperature),
            new_token_bucket=_new_token_bucket(max_new_tokens),
        )
        tokens, logprobs = np.asarray(tokens), np.asarray(logprobs)

        completions = []
        for row in range(len(prompts)):
            row_tokens = tokens[row, :max_new_tokens].tolist()
            finished = self._eos_id in row_tokens
            length = row_tokens.index(self._eos_id) + 1 if finished else max_new_tokens
            completions.append(
                Completion(
                    token_ids=row_tokens[:length],
                    logprobs=logprobs[row, :length].tolist(),
                    finished=finished,
                )
            )
        return completions

    def _generate_traced(
        self,
        params: nnx.State,
        prompt_tokens: jax.Array,
        prompt_mask: jax.Array,
        rng_key: jax.Array,
        max_new_tokens: jax.Array,
        temperature: jax.Array,
        *,
        new_token_bucket: int,
    ) -> tuple[jax.Array, jax.Array]:
        """Prefill, then sample token by token; returns [B, new_token_bucket] tokens and logprobs.

        Slots of a row after its EOS (and all slots of dummy rows) hold
        ``pad_id`` with log-prob 0.
        """
        # Runs only while tracing, so it counts compilations.
        self._compile_count += 1
        model = nnx.merge(self._graphdef, params)
        batch_size, prompt_len = prompt_tokens.shape
        cache_len = prompt_len + new_token_bucket

        prompt_lengths = prompt_mask.sum(axis=1).astype(jnp.int32)
        prompt_positions = jnp.maximum(jnp.cumsum(prompt_mask, axis=1) - 1, 0).astype(jnp.int32)
        # Generated slots are never padding; slots not yet written are hidden by causality.
        key_mask = jnp.concatenate(
            [prompt_mask, jnp.ones((batch_size, new_token_bucket), jnp.bool_)], axis=1
        )
        cache = model.init_cache(batch_size, cache_len, jnp.float32)
        logits, cache = model.decode(prompt_tokens, prompt_positions, cache, jnp.int32(0), key_mask)

        def keep_going(carry):
            step, _, _, done, _, _ = carry
            return (step < max_new_tokens) & ~jnp.all(done)

        def sample_next(carry):
            step, cache, next_logits, done, tokens, logprobs = carry
            scaled_logprobs = jax.nn.log_softmax(next_logits / temperature, axis=-1)
            token = jax.random.categorical(jax.random.fold_in(rng_key, step), scaled_logprobs)
            token_logprob = jnp.take_along_axis(scaled_logprobs, token[:, None], axis=-1)[:, 0]
            token = jnp.where(done, self._pad_id, token).astype(jnp.int32)
            token_logprob = jnp.where(done, 0.0, token_logprob)
            tokens = tokens.at[:, step].set(token)
            logprobs = logprobs.at[:, step].set(token_logprob)
            done = done | (token == self._eos_id)
            # Feed the token back; on the last step these logits go unused.
            step_logits, cache = model.decode(
                token[:, None],
                (prompt_lengths + step)[:, None],
                cache,
                prompt_len + step,
                key_mask,
            )
            return step + 1, cache, step_logits[:, 0], done, tokens, logprobs

        initial = (
            jnp.int32(0),
            cache,
            logits[:, -1],
            prompt_lengths == 0,  # dummy rows that only pad the batch
            jnp.full((batch_size, new_token_bucket), self._pad_id, jnp.int32),
            jnp.zeros((batch_size, new_token_bucket), jnp.float32),
        )
        _, _, _, _, tokens, logprobs = jax.lax.while_loop(keep_going, sample_next, initial)
        return tokens, logprobs
