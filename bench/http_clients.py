"""CPU per HTTP request of episodes sharing one client against a client per few episodes.

Starts the example environment server (50 ms per step), then runs 96 concurrent
"episodes" that each send 10 requests, once with every episode on one shared
httpx client and once with a client per ``EPISODES_PER_CLIENT`` episodes (what
``SharedHTTPClients`` hands out), alternating ``--repeats`` times. Reports this
process's CPU milliseconds per request for each, and their ratio.

Usage: ``python bench/http_clients.py [--episodes 96] [--requests 10] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workers.environments import http_example_server  # noqa: E402
from workers.environments.http import _SHARED_LIMITS, EPISODES_PER_CLIENT, _new_client  # noqa: E402


async def cpu_ms_per_request(url: str, *, clients: int, episodes: int, requests: int) -> float:
    # Each client keeps alive a connection for every episode it serves, as SharedHTTPClients' do.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=-(-episodes // clients),
                          keepalive_expiry=_SHARED_LIMITS.keepalive_expiry)
    pool = [_new_client(url, 30.0, limits=limits) for _ in range(clients)]

    async def episode(index: int) -> None:
        client = pool[index % clients]
        for _ in range(requests):
            response = await client.post("/task", json={"seed": index})
            response.json()
            await asyncio.sleep(0.05)  # the episode's policy turn

    started = time.process_time()
    await asyncio.gather(*(episode(index) for index in range(episodes)))
    cpu_s = time.process_time() - started
    for client in pool:
        await client.aclose()
    return cpu_s * 1000 / (episodes * requests)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--episodes", type=int, default=96)
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    shared, leased = [], []
    with http_example_server.running(latency_ms=50) as url:
        per_client = -(-args.episodes // EPISODES_PER_CLIENT)
        for _ in range(args.repeats):
            shared.append(asyncio.run(cpu_ms_per_request(url, clients=1, episodes=args.episodes,
                                                         requests=args.requests)))
            leased.append(asyncio.run(cpu_ms_per_request(url, clients=per_client, episodes=args.episodes,
                                                         requests=args.requests)))
    one, many = statistics.median(shared), statistics.median(leased)
    print(json.dumps({
        "one_client_cpu_ms_per_request": round(one, 3),
        f"client_per_{EPISODES_PER_CLIENT}_episodes_cpu_ms_per_request": round(many, 3),
        "one_client_over_leased": round(one / many, 2),
        "episodes": args.episodes, "requests_per_episode": args.requests, "repeats": args.repeats,
    }))


if __name__ == "__main__":
    main()
