"""A process that holds episode slots (workers/episode_slots.py), for the tests of limits across processes.

    python -m tests.workers.slot_holder REDIS_URL KEY --limit 2 --episodes 6 --hold-s 0.2 --log LOG_KEY
        runs ``--episodes`` concurrent holders, each counting itself into ``LOG_KEY:running``
        while it holds its slot and pushing the count it saw to ``LOG_KEY`` (with ``--barrier KEY
        --processes N``, once N holder processes are ready);
    python -m tests.workers.slot_holder REDIS_URL KEY --limit 1 --forever --log LOG_KEY
        takes one slot, pushes its lease id to ``LOG_KEY`` and holds it until killed.
"""

from __future__ import annotations

import argparse
import asyncio

from tandem.runtime.redis_clients import durable_async_redis
from workers.episode_slots import EpisodeSlots


async def hold(arguments: argparse.Namespace) -> None:
    client = durable_async_redis(arguments.redis_url)
    slots = EpisodeSlots(client=client, key=arguments.key, limit=arguments.limit, lease_s=arguments.lease_s)
    running = f"{arguments.log}:running"

    async def episode() -> None:
        async with slots.held() as slot:
            if arguments.forever:
                await client.rpush(arguments.log, slot.lease_id)
                await asyncio.Event().wait()
            await client.rpush(arguments.log, await client.incr(running))
            await asyncio.sleep(arguments.hold_s)
            await client.decr(running)

    try:
        if arguments.barrier:
            # Every holder process starts its episodes together, so that they compete for the slots.
            await client.incr(arguments.barrier)
            while int(await client.get(arguments.barrier)) < arguments.processes:
                await asyncio.sleep(0.01)
        await asyncio.gather(*(episode() for _ in range(arguments.episodes)))
    finally:
        await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("redis_url")
    parser.add_argument("key")
    parser.add_argument("--limit", type=int, required=True)
    parser.add_argument("--episodes", type=int, default=1)
    parser.add_argument("--hold-s", type=float, default=0.0)
    parser.add_argument("--lease-s", type=float, default=30.0)
    parser.add_argument("--forever", action="store_true")
    parser.add_argument("--log", required=True)
    parser.add_argument("--barrier", default="", help="a Redis counter every holder process waits on")
    parser.add_argument("--processes", type=int, default=1, help="how many processes the barrier waits for")
    asyncio.run(hold(parser.parse_args()))


if __name__ == "__main__":
    main()
