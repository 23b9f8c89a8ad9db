"""Episode slots (workers/episode_slots.py) against a real Redis, within a process and across processes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid

import pytest
import redis.asyncio as aioredis
from aiohttp import web

from environments.adapters.http import RemoteHTTPEnvironment
from tandem.contracts import (
    EnvironmentSpec,
    environment_episode_slots_key,
    unregistered_environment_episode_slots_key,
)
from tandem.runtime.redis_clients import durable_async_redis
from tests.conftest import REPO_ROOT
from tests.workers.capacity_server import build_app
from workers.episode_slots import (
    UNLIMITED,
    EpisodeSlots,
    RunStoppedWaiting,
    advertised_max_concurrent_episodes,
    episode_slots_for,
    episode_slots_key,
)


@pytest.fixture
def slots_key(redis_client):
    key = f"tandem:test:{uuid.uuid4().hex}:episode_slots"
    yield key
    redis_client.delete(key, f"{key}:log", f"{key}:log:running", f"{key}:barrier")


def test_a_spec_without_a_limit_has_unlimited_slots_and_one_with_a_limit_is_keyed_by_its_version():
    client = aioredis.Redis()  # never connects
    unlimited = EnvironmentSpec(name="calc", kind="python", entrypoint="m:C")
    assert episode_slots_for(unlimited, client) is UNLIMITED
    limited = unlimited.model_copy(update={"version_id": 7, "max_concurrent_episodes": 3})
    slots = episode_slots_for(limited, client)
    assert (slots.key, slots.limit) == (environment_episode_slots_key(7), 3)
    assert slots.key == "tandem:environment_version:7:episode_slots"
    assert episode_slots_key(unlimited) == unregistered_environment_episode_slots_key("calc")


def test_a_spec_refuses_a_limit_below_one():
    with pytest.raises(ValueError, match="max_concurrent_episodes"):
        EnvironmentSpec(name="calc", kind="python", entrypoint="m:C", max_concurrent_episodes=0)


def test_episodes_of_one_process_wait_for_a_slot_and_never_exceed_the_limit(redis_url, slots_key):
    async def scenario():
        client = durable_async_redis(redis_url)
        slots = EpisodeSlots(client=client, key=slots_key, limit=2)
        running = peak = 0
        waits = []

        async def episode():
            nonlocal running, peak
            async with slots.held() as slot:
                running += 1
                peak = max(peak, running)
                await asyncio.sleep(0.05)
                running -= 1
            waits.append(slot.wait_s)

        await asyncio.gather(*(episode() for _ in range(6)))
        left = await client.zcard(slots_key)
        await client.aclose()
        return peak, waits, left

    peak, waits, left = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert peak == 2
    # Six episodes of 50 ms through two slots: four of them waited for one to end.
    assert sum(wait >= 0.05 for wait in waits) >= 4
    assert left == 0  # every slot was given back


def test_the_limit_holds_across_processes(redis_client, redis_url, slots_key):
    log = f"{slots_key}:log"
    command = [sys.executable, "-m", "tests.workers.slot_holder", redis_url, slots_key, "--limit", "2",
               "--episodes", "6", "--hold-s", "0.1", "--log", log, "--barrier", f"{slots_key}:barrier",
               "--processes", "2"]
    holders = [subprocess.Popen(command, cwd=REPO_ROOT) for _ in range(2)]
    assert [holder.wait(timeout=60) for holder in holders] == [0, 0]
    seen = [int(count) for count in redis_client.lrange(log, 0, -1)]
    # Twelve episodes, each seeing how many held a slot with it: never more than the limit.
    assert len(seen) == 12 and max(seen) == 2
    assert redis_client.zcard(slots_key) == 0


def test_a_dead_holders_slot_comes_back_when_its_lease_expires(redis_client, redis_url, slots_key):
    log = f"{slots_key}:log"
    holder = subprocess.Popen([sys.executable, "-m", "tests.workers.slot_holder", redis_url, slots_key,
                               "--limit", "1", "--forever", "--lease-s", "1", "--log", log], cwd=REPO_ROOT)
    try:
        dead_lease = redis_client.blpop([log], timeout=60)[1].decode()
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
    # Killed: it neither released its slot nor renews it any more.
    assert redis_client.zscore(slots_key, dead_lease) is not None

    async def take_the_slot():
        client = durable_async_redis(redis_url)
        slots = EpisodeSlots(client=client, key=slots_key, limit=1)
        try:
            async with slots.held() as slot:
                return slot, [member.decode() for member in await client.zrange(slots_key, 0, -1)]
        finally:
            await client.aclose()

    slot, holders = asyncio.run(asyncio.wait_for(take_the_slot(), 30))
    assert holders == [slot.lease_id]  # the dead lease expired and was dropped
    assert slot.wait_s > 0


def test_a_held_slot_is_renewed_past_its_lease(redis_url, slots_key):
    async def scenario():
        client = durable_async_redis(redis_url)
        slots = EpisodeSlots(client=client, key=slots_key, limit=1, lease_s=0.3)
        try:
            async with slots.held():
                await asyncio.sleep(1.0)  # three leases long; renewed every 0.1 s
                return await slots.try_acquire("another episode")
        finally:
            await client.aclose()

    # Bounded: a command that hangs fails the test in a minute rather than at pytest's timeout.
    assert asyncio.run(asyncio.wait_for(scenario(), 60)) is False


def test_a_stopped_run_stops_its_episodes_waiting(redis_url, slots_key):
    async def scenario():
        client = durable_async_redis(redis_url)
        slots = EpisodeSlots(client=client, key=slots_key, limit=1)
        checks = 0

        async def stopped():
            nonlocal checks
            checks += 1
            return checks >= 2

        try:
            async with slots.held():
                with pytest.raises(RunStoppedWaiting):
                    await asyncio.wait_for(slots.acquire(stopped=stopped), 30)
            return await client.zcard(slots_key)
        finally:
            await client.aclose()

    assert asyncio.run(asyncio.wait_for(scenario(), 60)) == 0


def test_an_http_server_advertises_its_capacity_in_its_schema():
    async def scenario(advertise: bool):
        runner = web.AppRunner(build_app(capacity=3, advertise=advertise))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        environment = RemoteHTTPEnvironment(url=f"http://127.0.0.1:{port}")
        try:
            return await advertised_max_concurrent_episodes(environment, kind="http")
        finally:
            await environment.close()
            await runner.cleanup()

    assert asyncio.run(scenario(True)) == 3
    assert asyncio.run(scenario(False)) is None


@pytest.mark.parametrize(("declared", "advertised"), [(4, 4), (None, None), (0, None), (True, None), ("8", None)])
def test_a_class_advertises_its_capacity_by_an_attribute(declared, advertised):
    class Declaring:
        max_concurrent_episodes = declared

    assert asyncio.run(advertised_max_concurrent_episodes(Declaring(), kind="python")) == advertised


def test_redis_clock_scores_the_leases(redis_client, redis_url, slots_key):
    """Leases are scored by Redis's TIME (ms), not the producer's clock: hosts may disagree."""
    async def scenario():
        client = durable_async_redis(redis_url)
        try:
            await EpisodeSlots(client=client, key=slots_key, limit=1, lease_s=10).try_acquire("lease")
        finally:
            await client.aclose()

    asyncio.run(scenario())
    seconds, microseconds = redis_client.time()
    now_ms = seconds * 1000 + microseconds // 1000
    assert now_ms < redis_client.zscore(slots_key, "lease") <= now_ms + 10_000
    assert 0 < redis_client.pttl(slots_key) <= 10_000


def test_slots_refuse_a_limit_below_one():
    with pytest.raises(ValueError, match="limit must be >= 1"):
        EpisodeSlots(client=aioredis.Redis(), key="k", limit=0)


def test_a_cancelled_episode_leaves_no_slot_taken(redis_url, slots_key):
    """A rollout task past its time limit cancels its episodes, waiting or holding."""
    async def scenario():
        client = durable_async_redis(redis_url)
        slots = EpisodeSlots(client=client, key=slots_key, limit=1)

        async def episode():
            async with slots.held():
                await asyncio.Event().wait()

        try:
            holder = asyncio.ensure_future(episode())
            while not await client.zcard(slots_key):
                await asyncio.sleep(0.01)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(slots.acquire(), 0.2)  # waits, then is cancelled
            holder.cancel()
            with pytest.raises(asyncio.CancelledError):
                await holder
            return await client.zcard(slots_key)
        finally:
            await client.aclose()

    assert asyncio.run(asyncio.wait_for(scenario(), 60)) == 0
