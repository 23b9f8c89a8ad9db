"""Per-environment concurrency limits: at most ``max_concurrent_episodes`` episodes of a version at once.

The limit holds across every producer on every host, so it lives in Redis: a
sorted set per environment version (:func:`~tandem.contracts.environment_episode_slots_key`)
of the leases of the episodes holding a slot, each scored by its expiry. A Lua
script takes a slot atomically: it drops the expired leases, then adds the new
one if fewer than the limit remain. Times are Redis's own clock (``TIME``), so
hosts whose clocks disagree still agree on which leases expired.

An episode holds its lease from before ``reset`` until the episode has ended
(its environment closed), renewing it every third of ``lease_s`` meanwhile, and
releases it in a ``finally``. A producer that dies stops renewing: its slots
come back once their leases expire, within ``lease_s``.

An episode that finds no slot waits for one (:meth:`EpisodeSlots.held`), polling
with a jittered backoff and woken at once by this producer's own releases. The
wait is bounded by the rollout task's time limit (it is cancelled with the
task) and by the run's stop flag, which ends it with :class:`RunStoppedWaiting`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from environments import Environment
from tandem.contracts import (
    EnvironmentSpec,
    environment_episode_slots_key,
    unregistered_environment_episode_slots_key,
)

logger = logging.getLogger(__name__)

#: Seconds a lease lasts without renewal: how long a dead producer's slots stay taken.
DEFAULT_LEASE_S = 30.0
#: The longest wait between two tries for a slot; a producer's own releases wake it sooner.
DEFAULT_MAX_POLL_S = 1.0
_FIRST_POLL_S = 0.05
#: How often a waiting episode reads its run's stop flag, at most.
_STOP_CHECK_S = 1.0

# KEYS[1]: the slots; ARGV: lease id, limit, lease milliseconds. 1: held (taken or renewed), 0: full.
# A lease that is still there is renewed whatever the count, so a holder never loses its slot to a
# lower limit another producer runs with. The key expires with its newest lease.
_ACQUIRE_SCRIPT = """
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000 + math.floor(tonumber(now_parts[2]) / 1000)
local lease_ms = tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[1]) or redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('ZADD', KEYS[1], now + lease_ms, ARGV[1])
  redis.call('PEXPIRE', KEYS[1], lease_ms)
  return 1
end
return 0
"""


class RunStoppedWaiting(RuntimeError):
    """The run stopped while an episode waited for a slot; the episode never started."""


def episode_slots_key(spec: EnvironmentSpec) -> str:
    """The Redis key of ``spec``'s slots: by version id, or by name for an environment outside the registry."""
    if spec.version_id is not None:
        return environment_episode_slots_key(spec.version_id)
    return unregistered_environment_episode_slots_key(spec.name)


@dataclass(frozen=True)
class EpisodeSlot:
    """A slot an episode holds: its lease in Redis, and how long it waited for it."""

    lease_id: str
    wait_s: float


@dataclass
class EpisodeSlots:
    """The slots of one environment version, as one producer takes and gives them back.

    ``client`` must belong to the event loop the episodes run on.
    """

    client: aioredis.Redis
    key: str
    limit: int
    lease_s: float = DEFAULT_LEASE_S
    max_poll_s: float = DEFAULT_MAX_POLL_S
    _released: asyncio.Event | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.limit < 1 or self.lease_s <= 0:
            raise ValueError(f"limit must be >= 1 and lease_s > 0 (got {self.limit}, {self.lease_s})")
        self._script = self.client.register_script(_ACQUIRE_SCRIPT)

    def _lease_ms(self) -> int:
        return max(int(self.lease_s * 1000), 1)

    async def try_acquire(self, lease_id: str) -> bool:
        """Take a slot for ``lease_id``, or renew it if it holds one; False if every slot is taken."""
        return bool(await self._script(keys=[self.key], args=[lease_id, self.limit, self._lease_ms()]))

    async def acquire(self, *, stopped: Callable[[], Awaitable[bool]] | None = None) -> EpisodeSlot:
        """Wait for a slot; raises RunStoppedWaiting once ``stopped()`` says the run stopped."""
        lease_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"
        began = time.monotonic()
        poll_s = _FIRST_POLL_S
        next_stop_check = began
        try:
            while not await self.try_acquire(lease_id):
                now = time.monotonic()
                if stopped is not None and now >= next_stop_check:
                    if await stopped():
                        raise RunStoppedWaiting(f"the run stopped while an episode waited for a slot of {self.key}")
                    next_stop_check = now + _STOP_CHECK_S
                await self._wait_for_release(poll_s * random.uniform(0.5, 1.0))
                poll_s = min(poll_s * 2, self.max_poll_s)
        except asyncio.CancelledError:
            # Cancelled (the task's time limit) perhaps after Redis took the slot but before the answer came.
            with contextlib.suppress(Exception):
                await self.client.zrem(self.key, lease_id)
            raise
        return EpisodeSlot(lease_id=lease_id, wait_s=time.monotonic() - began)

    async def release(self, slot: EpisodeSlot) -> None:
        await self.client.zrem(self.key, slot.lease_id)
        if self._released is not None:
            # Wake this producer's waiters now rather than at their next poll.
            self._released.set()
            self._released = None

    async def _wait_for_release(self, timeout_s: float) -> None:
        if self._released is None:
            self._released = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._released.wait(), timeout_s)

    async def _renew(self, slot: EpisodeSlot) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                held = await self.try_acquire(slot.lease_id)
            except Exception as exc:  # noqa: BLE001 - a failed renewal must not end the episode
                logger.warning("renewing episode slot %s of %s failed: %s", slot.lease_id, self.key, exc)
                continue
            if not held:
                # Its lease expired (the loop stalled past lease_s) and others took every slot.
                logger.warning("episode slot %s of %s expired and was taken; the environment may run "
                               "more than %d episodes until one ends", slot.lease_id, self.key, self.limit)

    @contextlib.asynccontextmanager
    async def held(self, *, stopped: Callable[[], Awaitable[bool]] | None = None) -> AsyncIterator[EpisodeSlot]:
        """A slot for the body's episode, renewed while it runs and released when it ends, however it ends."""
        slot = await self.acquire(stopped=stopped)
        renewal = asyncio.ensure_future(self._renew(slot))
        try:
            yield slot
        finally:
            renewal.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewal
            try:
                await self.release(slot)
            except Exception as exc:  # noqa: BLE001 - its lease expires on its own
                logger.warning("releasing episode slot %s of %s failed (it expires within %gs): %s",
                               slot.lease_id, self.key, self.lease_s, exc)


class _Unlimited:
    """The slots of an environment without a limit: every episode has one at once."""

    @contextlib.asynccontextmanager
    async def held(self, *, stopped: Callable[[], Awaitable[bool]] | None = None) -> AsyncIterator[EpisodeSlot]:
        yield EpisodeSlot(lease_id="", wait_s=0.0)


UNLIMITED = _Unlimited()


def episode_slots_for(spec: EnvironmentSpec, client: aioredis.Redis, **options: Any) -> EpisodeSlots | _Unlimited:
    """The slots producers hold to for ``spec``'s episodes; :data:`UNLIMITED` when it has no limit."""
    if spec.max_concurrent_episodes is None:
        return UNLIMITED
    return EpisodeSlots(client=client, key=episode_slots_key(spec), limit=spec.max_concurrent_episodes, **options)


def valid_capacity(value: Any) -> int | None:
    """``value`` if it is a capacity (an int >= 1, not a bool), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    return None


async def advertised_max_concurrent_episodes(environment: Environment, *, kind: str) -> int | None:
    """The concurrent episodes ``environment`` (of registration ``kind``) says it can serve; None if it says nothing.

    A class may declare ``max_concurrent_episodes``; an HTTP server may put
    ``"max_concurrent_episodes"`` in its ``/schema`` (docs/environments.md). The
    probe calls this after a reset, and the platform keeps the smaller of it and
    the registration's limit. A value that is not an int >= 1 is ignored, with a log line.
    """
    declared = getattr(environment, "max_concurrent_episodes", None)
    if declared is None:
        # A class with the interface's methods but not its base is loaded wrapped (environments/loading.py).
        declared = getattr(getattr(environment, "wrapped", None), "max_concurrent_episodes", None)
    if declared is None and kind == "http":
        # The adapter keeps only the schema's name and tools. Its own request, so that its URL
        # checks (at connect time too) and retries hold for this one as well.
        payload = await environment._request("GET", "/schema", idempotent=True)
        declared = payload.get("max_concurrent_episodes")
    capacity = valid_capacity(declared)
    if declared is not None and capacity is None:
        logger.warning("%s advertises max_concurrent_episodes=%r, not an int >= 1; ignored",
                       type(environment).__name__, declared)
    return capacity
