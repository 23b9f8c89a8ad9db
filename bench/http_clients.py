"""CPU per HTTP request of remote environments: the producers' aiohttp session against httpx.

Starts the example environment server (50 ms per step), then runs 96
concurrent "episodes" that each send 10 requests, alternating ``--repeats``
times between:

- ``aiohttp_shared``: every episode on one aiohttp session, as a producer's
  episodes share :class:`~environments.adapters.http.SharedHTTPSession`'s;
- ``httpx_per_4``: an httpx client per 4 episodes, the producers' transport
  before (httpx's pool walks every connection on each request, so sharing
  one client among more episodes cost more per request);
- ``httpx_shared``: every episode on one httpx client.

Reports this process's CPU milliseconds per request for each (median over
repeats) and the ratios of the httpx ones to aiohttp's.

Usage: ``python bench/http_clients.py [--episodes 96] [--requests 10] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from environments import (
    SharedHTTPSession,  # noqa: E402
    http_example_server,  # noqa: E402
)

EPISODE_TURN_S = 0.05  # the policy's turn between two requests of an episode
HTTPX_EPISODES_PER_CLIENT = 4


async def cpu_ms_per_request(post: Callable[[int], Awaitable[None]], *, episodes: int, requests: int) -> float:
    async def episode(index: int) -> None:
        for _ in range(requests):
            await post(index)
            await asyncio.sleep(EPISODE_TURN_S)

    started = time.process_time()
    await asyncio.gather(*(episode(index) for index in range(episodes)))
    return (time.process_time() - started) * 1000 / (episodes * requests)


async def aiohttp_shared(url: str, *, episodes: int, requests: int) -> float:
    shared = SharedHTTPSession()

    async def post(index: int) -> None:
        async with shared.session().post(f"{url}/task", json={"seed": index}) as response:
            json.loads(await response.read())

    try:
        return await cpu_ms_per_request(post, episodes=episodes, requests=requests)
    finally:
        await shared.aclose()


async def httpx_clients(url: str, *, episodes: int, requests: int, episodes_per_client: int) -> float:
    # Each client keeps alive a connection for every episode it serves.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=episodes_per_client, keepalive_expiry=2.0)
    clients = [httpx.AsyncClient(base_url=url, timeout=30.0, limits=limits)
               for _ in range(-(-episodes // episodes_per_client))]

    async def post(index: int) -> None:
        response = await clients[index // episodes_per_client].post("/task", json={"seed": index})
        response.json()

    try:
        return await cpu_ms_per_request(post, episodes=episodes, requests=requests)
    finally:
        for client in clients:
            await client.aclose()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=96)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sizes = {"episodes": args.episodes, "requests": args.requests}
    variants = {
        "aiohttp_shared": lambda url: aiohttp_shared(url, **sizes),
        f"httpx_per_{HTTPX_EPISODES_PER_CLIENT}": lambda url: httpx_clients(
            url, **sizes, episodes_per_client=HTTPX_EPISODES_PER_CLIENT),
        "httpx_shared": lambda url: httpx_clients(url, **sizes, episodes_per_client=args.episodes),
    }
    measured: dict[str, list[float]] = {name: [] for name in variants}
    with http_example_server.running(latency_ms=50) as url:
        for _ in range(args.repeats):
            for name, variant in variants.items():
                measured[name].append(asyncio.run(variant(url)))
    medians = {name: statistics.median(values) for name, values in measured.items()}
    ours = medians["aiohttp_shared"]
    print(json.dumps({
        **{f"{name}_cpu_ms_per_request": round(value, 3) for name, value in medians.items()},
        **{f"{name}_over_aiohttp_shared": round(value / ours, 2) for name, value in medians.items()
           if name != "aiohttp_shared"},
        "episodes": args.episodes, "requests_per_episode": args.requests, "repeats": args.repeats,
    }))


if __name__ == "__main__":
    main()
