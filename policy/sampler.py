"""Batch sampling: a list of prompts in, one completion per prompt out.

This is the simple, synchronous front of :class:`policy.engine.InferenceEngine`
for callers that have all their prompts at hand (tests, evaluation,
benchmarks). The prompts are one-off requests of a private engine that this
call drives in the calling thread (no background thread), so they get
everything the engine does:
continuous batching (more prompts than slots are admitted as rows finish, and
a row that hits EOS frees its slot at the next chunk), compile buckets, and
the same sampling and log-probabilities as the producers' episodes.

Producers do not use this class: they share one long-lived engine per run
(``workers.policy``), which also keeps each episode's KV prefix across turns.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence

import numpy as np
from flax import nnx

from policy.engine import Completion, InferenceEngine, SamplingParams
from policy.model import Transformer, TransformerConfig

__all__ = ["Sampler"]


class Sampler:
    """Generates completions for a batch of prompts with given parameters.

    ``graphdef`` and ``params`` are the two halves of
    :func:`policy.model.split_model` (``nnx.split(model, nnx.Param)``).
    Parameters are an argument of every call, not captured, so new weights
    do not recompile as long as their shapes and dtypes do not change.

    Shapes are padded to buckets: ``batch_buckets`` are the row counts of a
    decode chunk and of a prefill group (the largest one is the number of
    prompts decoded at once), ``prompt_buckets`` the padded prompt lengths
    (capped at ``max_seq_len``, which is always a bucket). ``max_new_tokens``,
    the temperature, top-p/top-k and the seed are traced values.

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
        batch_buckets: Sequence[int] = (1, 4, 16, 64),
        prompt_buckets: Sequence[int] = (32, 64, 128, 256),
        chunk_size: int = 8,
    ):
        if not batch_buckets or not prompt_buckets:
            raise ValueError("batch_buckets and prompt_buckets must not be empty")
        self._engine = InferenceEngine(
            graphdef,
            config=config,
            eos_id=eos_id,
            pad_id=pad_id,
            num_slots=max(batch_buckets),
            chunk_size=chunk_size,
            prefill_buckets=prompt_buckets,
            row_buckets=batch_buckets,
            background=False,
        )
        self._lock = threading.Lock()

    @property
    def compile_count(self) -> int:
        """How many times a jitted function of the engine was traced (once per shape bucket)."""
        return self._engine.trace_count

    @property
    def engine(self) -> InferenceEngine:
        return self._engine

    def generate(
        self,
        params: nnx.State,
        prompts: list[list[int]],
        sampling: SamplingParams,
    ) -> list[Completion]:
        """Sample up to ``sampling.max_new_tokens`` tokens after each prompt.

        ``sampling.seed`` seeds the batch: each row draws its own seed from it.
        Rows are independent: a row's tokens depend on the seed, its index in
        ``prompts`` and its prompt, never on the other prompts (up to float
        rounding of differently padded batches).
        """
        rng = np.random.default_rng(sampling.seed)
        row_seeds = rng.integers(0, 2**31 - 1, len(prompts)).tolist()
        with self._lock:
            self._engine.set_params(params, version=0)
            futures = []
            for index, (prompt, row_seed) in enumerate(zip(prompts, row_seeds, strict=True)):
                try:
                    row_sampling = dataclasses.replace(sampling, seed=row_seed)
                    futures.append(self._engine.submit(None, prompt, row_sampling))
                except ValueError as exc:
                    for future in futures:
                        future.cancel()  # still queued: the engine drops them
                    raise ValueError(f"prompt {index}: {exc}") from exc
            self._engine.run_until(futures)
        return [future.result() for future in futures]
