"""An HTTP environment (protocol version 1) that serves at most ``capacity`` episodes at once.

For the concurrency-limit tests: it counts the episodes open between their
``/reset`` and their end, the ``/step`` that answers ``done`` (every step does,
after ``step_s``) or the producer's ``/close``, whichever comes first; refuses a
reset past ``capacity`` with HTTP 429; and reports the peak on ``GET /stats``
(not part of the protocol). ``--advertise`` puts the
capacity in ``/schema`` as ``max_concurrent_episodes``.

    python -m tests.workers.capacity_server --port 8790 --capacity 2 --step-s 0.3 --advertise
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass, field

from aiohttp import web


@dataclass
class CapacityCounter:
    capacity: int
    open_episodes: set[str] = field(default_factory=set)
    peak: int = 0
    episodes: int = 0
    refused: int = 0

    def open(self, episode_id: str) -> bool:
        if episode_id in self.open_episodes:
            return True  # a retried reset of the same episode
        if len(self.open_episodes) >= self.capacity:
            self.refused += 1
            return False
        self.open_episodes.add(episode_id)
        self.episodes += 1
        self.peak = max(self.peak, len(self.open_episodes))
        return True


def build_app(*, capacity: int, step_s: float = 0.0, advertise: bool = False) -> web.Application:
    counter = CapacityCounter(capacity)
    schema = {"name": "capped", "protocol_version": 1, "tools": []}
    if advertise:
        schema["max_concurrent_episodes"] = capacity

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def get_schema(request: web.Request) -> web.Response:
        return web.json_response(schema)

    async def task(request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"task": {"seed": body["seed"]}})

    async def reset(request: web.Request) -> web.Response:
        body = await request.json()
        if not counter.open(body["episode_id"]):
            return web.json_response(
                {"error": f"at capacity: {len(counter.open_episodes)}/{capacity} episodes open"}, status=429)
        return web.json_response({"observation": "Say anything.\n", "info": {}})

    async def step(request: web.Request) -> web.Response:
        body = await request.json()
        await asyncio.sleep(step_s)
        counter.open_episodes.discard(body["episode_id"])
        return web.json_response({"observation": "", "reward": 1.0, "done": True, "info": {}})

    async def close(request: web.Request) -> web.Response:
        counter.open_episodes.discard((await request.json())["episode_id"])
        return web.json_response({})

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({"capacity": capacity, "open": len(counter.open_episodes), "peak": counter.peak,
                                  "episodes": counter.episodes, "refused": counter.refused})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/schema", get_schema)
    app.router.add_post("/task", task)
    app.router.add_post("/reset", reset)
    app.router.add_post("/step", step)
    app.router.add_post("/close", close)
    app.router.add_get("/stats", stats)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--capacity", type=int, required=True)
    parser.add_argument("--step-s", type=float, default=0.0)
    parser.add_argument("--advertise", action="store_true")
    arguments = parser.parse_args()
    web.run_app(build_app(capacity=arguments.capacity, step_s=arguments.step_s, advertise=arguments.advertise),
                host=arguments.host, port=arguments.port, print=None)


if __name__ == "__main__":
    main()
