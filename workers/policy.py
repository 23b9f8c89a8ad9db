"""The policy as producers see it: one sampler per run, shared by all episodes.

Concurrent episodes ask for completions independently; :class:`BatchingPolicy`
coalesces whatever requests are waiting into one batched ``generate`` call,
run in a thread so environment waits keep overlapping with generation. New
weights are picked up between batches, so an episode never sees a version
change inside one turn, and each turn records the version that produced it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from dataclasses import dataclass

import redis
from flax import nnx

from tandem.run_config import RunConfig
from trainer.model import Transformer, TransformerConfig, split_model
from trainer.sampler import Completion, Sampler
from trainer.tokenizer import ByteTokenizer
from trainer.weights import RedisWeightSubscriber


class PolicyNotPublishedError(RuntimeError):
    """The trainer has not published any weights for this run yet."""


@dataclass(frozen=True)
class VersionedCompletion:
    completion: Completion
    policy_version: int
    batch_size: int


class PolicyRuntime:
    """Sampler plus current weights of one run, kept warm across Celery tasks."""

    def __init__(self, *, run_id: int, config: RunConfig, redis_client: redis.Redis,
                 weight_poll_s: float = 0.25):
        self.run_id = run_id
        self.config = config
        self.tokenizer = ByteTokenizer()
        model_config = TransformerConfig.from_model_config(config.model, self.tokenizer.vocab_size)
        abstract = nnx.eval_shape(lambda: Transformer(model_config, rngs=nnx.Rngs(0)))
        self._graphdef, self._params_like = split_model(abstract)
        self.sampler = Sampler(
            self._graphdef, config=model_config, eos_id=self.tokenizer.eos_id, pad_id=self.tokenizer.pad_id
        )
        self._subscriber = RedisWeightSubscriber(redis_client)
        self._weight_poll_s = weight_poll_s
        self._lock = threading.Lock()
        self.params = None
        self.policy_version = -1
        self._last_poll = 0.0

    def refresh_weights(self, *, force: bool = False) -> int:
        """Load the newest published weights if there are any; returns the version in use."""
        with self._lock:
            now = time.monotonic()
            if not force and now - self._last_poll < self._weight_poll_s and self.params is not None:
                return self.policy_version
            self._last_poll = now
            latest = self._subscriber.latest_version(self.run_id)
            if latest is not None and latest > self.policy_version:
                fetched = self._subscriber.fetch(self.run_id, self._params_like)
                if fetched is not None:
                    self.policy_version, self.params = fetched
            if self.params is None:
                raise PolicyNotPublishedError(f"run {self.run_id} has no published policy yet")
            return self.policy_version


class BatchingPolicy:
    """Per-event-loop front of a :class:`PolicyRuntime` that batches concurrent requests."""

    def __init__(self, runtime: PolicyRuntime, *, seed: int, max_batch: int = 64):
        self._runtime = runtime
        self._seed = seed
        self._max_batch = max_batch
        self._pending: list[tuple[list[int], asyncio.Future]] = []
        self._wakeup = asyncio.Event()
        self._worker: asyncio.Task | None = None
        self._batches = 0
        self.generation_s = 0.0

    async def generate(self, prompt: list[int]) -> VersionedCompletion:
        if self._worker is None:
            self._worker = asyncio.create_task(self._serve())
        future = asyncio.get_running_loop().create_future()
        self._pending.append((prompt, future))
        self._wakeup.set()
        return await future

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker

    async def _serve(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            # One loop turn lets episodes that became ready together join the batch.
            await asyncio.sleep(0)
            while self._pending:
                batch, self._pending = self._pending[: self._max_batch], self._pending[self._max_batch :]
                try:
                    completions, version = await asyncio.to_thread(self._generate_batch, [p for p, _ in batch])
                except Exception as exc:  # noqa: BLE001 - each waiting episode records the reason
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                for (_, future), completion in zip(batch, completions, strict=True):
                    if not future.done():
                        future.set_result(VersionedCompletion(completion, version, len(batch)))

    def _generate_batch(self, prompts: list[list[int]]) -> tuple[list[Completion], int]:
        runtime = self._runtime
        version = runtime.refresh_weights()
        started = time.perf_counter()
        self._batches += 1
        completions = runtime.sampler.generate(
            runtime.params,
            prompts,
            max_new_tokens=runtime.config.max_new_tokens,
            temperature=runtime.config.temperature,
            seed=hash((self._seed, self._batches)) & 0x7FFFFFFF,
        )
        self.generation_s += time.perf_counter() - started
        return completions, version
