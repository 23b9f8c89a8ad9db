"""An in-process environment served over Tandem's HTTP environment protocol: the calculator by default.

    python -m environments.http_example_server --port 8765 --latency-ms 200
    python -m environments.http_example_server --latency-ms 200 \
        --environment environments.builtin.guessing_game:GuessingGameEnvironment --settings '{"high": 100}'

Any :class:`~environments.base.Environment` subclass can be served
(one instance per episode; its tools answer ``/tool``), so an existing Python
environment can run on another machine unchanged.

``GET /stats`` (not part of the protocol) tells what clients did, for tests and
benchmarks: requests per route, the connections they came on, and episodes:
``{"reset": n, "closed": n, "open": n, "closed_unknown": n, "close_reasons": {reason: n}}``
(``reset`` counts episode ids, not retried requests; ``open`` those reset and not
closed yet; ``closed_unknown`` closes of an id that was not open: closed twice, or
never reset).

``POST /close`` ends the episode's environment (its ``close_episode`` and
``close``); ``GET /demonstrations`` serves the environment's own ``demonstrations()``.
``--write-dataset N`` serves nothing and prints N of them as a JSONL chat dataset
instead, the file to upload for a server that has no ``/demonstrations``
(``/faults/minimal``).

``--latency-ms`` delays every step and tool call, like an environment that
runs code or drives a browser: the case where asynchronous rollouts pay off,
since the policy keeps generating for other episodes while this one waits.

For testing clients, a path prefix ``/faults/<mode>`` selects a misbehaviour
on the same server, e.g. ``http://127.0.0.1:8765/faults/garbage-json``:

- ``garbage-json``: /step answers with a body that is not JSON
- ``missing-field``: /step answers without ``reward``
- ``wrong-type``: /step answers ``"done": "yes"``
- ``huge-observation``: /reset answers a 1 MB observation
- ``hang``: /reset never answers
- ``flaky``: the first two /reset requests of each episode answer 503
- ``hang-step``: /step never answers
- ``minimal``: only the protocol's required routes: /close and /demonstrations answer 404,
  and /schema does not advertise demonstrations
- ``bad-demonstrations``: /demonstrations answers a turn of an unknown role
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import inspect
import json
import random
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

from environments.base import Environment
from environments.builtin.calculator import CalculatorEnvironment

FAULTS = ("garbage-json", "missing-field", "wrong-type", "huge-observation", "hang", "flaky", "hang-step",
          "minimal", "bad-demonstrations")
# Most demonstrations one request may ask for.
MAX_DEMONSTRATIONS = 1024


class EnvironmentServer:
    """An ASGI app; episodes live in memory, keyed by the client's episode id.

    ``environment_factory`` builds one environment per episode (and one to
    draw tasks and declare tools); ``name`` is what ``/schema`` reports.
    """

    def __init__(self, environment_factory: Callable[[], Environment] = CalculatorEnvironment, *,
                 name: str = "calculator", latency_ms: float = 0.0, max_episodes: int = 10_000):
        self.environment_factory = environment_factory
        self.name = name
        self._task_source = environment_factory()
        self.latency_s = latency_ms / 1000
        self.max_episodes = max_episodes
        self.episodes: dict[str, Environment] = {}
        self.reset_attempts: dict[str, int] = {}
        self.requests: collections.Counter[str] = collections.Counter()
        self.client_addresses: set[tuple[str, int]] = set()
        self.open_episode_ids: set[str] = set()  # reset, not closed yet
        self.episodes_reset = 0
        self.closed_unknown = 0
        self.close_reasons: collections.Counter[str] = collections.Counter()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.requests[f"{scope['method']} {scope['path']}"] += 1
        if scope.get("client"):
            self.client_addresses.add(tuple(scope["client"]))
        fault, path = None, scope["path"]
        if path.startswith("/faults/"):
            parts = path.split("/", 3)  # "", "faults", mode, and the route without its slash
            fault, path = parts[2], "/" + (parts[3] if len(parts) > 3 else "")
        try:
            request = json.loads(body) if body else {}
            query = dict(urllib.parse.parse_qsl(scope.get("query_string", b"").decode()))
            status, payload = await self.handle(scope["method"], path, request, fault, query)
        except (KeyError, TypeError, ValueError, json.JSONDecodeError) as exc:
            status, payload = 400, {"error": f"{type(exc).__name__}: {exc}"}
        raw = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": raw})

    async def handle(self, method: str, path: str, request: dict[str, Any], fault: str | None,
                     query: dict[str, str] | None = None):
        if fault is not None and fault not in FAULTS:
            return 404, {"error": f"unknown fault {fault!r}"}
        route = (method, path)
        if route == ("GET", "/health"):
            return 200, {"status": "ok"}
        if route == ("GET", "/stats"):
            return 200, {"requests": dict(self.requests), "connections": len(self.client_addresses),
                         "episodes": {"reset": self.episodes_reset,
                                      "closed": sum(self.close_reasons.values()) - self.closed_unknown,
                                      "open": len(self.open_episode_ids), "closed_unknown": self.closed_unknown,
                                      "close_reasons": dict(self.close_reasons)}}
        if route == ("GET", "/schema"):
            schema = {"name": self.name, "protocol_version": 1,
                      "tools": [{"name": tool.name, "description": tool.description,
                                 "parameters": tool.parameters} for tool in self._task_source.tools]}
            if fault != "minimal":
                schema["demonstrations"] = True  # every environment has them, if only []
            return 200, schema
        if fault == "minimal" and path in ("/close", "/demonstrations"):
            return 404, {"error": f"no route {method} {path}"}
        if route == ("GET", "/demonstrations"):
            return 200, {"demonstrations": await self._demonstrations(query or {}, fault)}
        if route == ("POST", "/close"):
            episode_id, reason = str(request["episode_id"]), str(request["reason"])
            self.close_reasons[reason] += 1
            if episode_id in self.open_episode_ids:
                self.open_episode_ids.discard(episode_id)
            else:
                self.closed_unknown += 1
            environment = self.episodes.pop(episode_id, None)
            if environment is not None:
                await environment.close_episode(reason)
                await environment.close()
            return 200, {}
        if route == ("POST", "/task"):
            rng = random.Random(int(request["seed"]))
            if request.get("split", "train") == "evaluation":
                return 200, {"task": self._task_source.sample_evaluation_task(rng)}
            return 200, {"task": self._task_source.sample_task(rng)}
        if route == ("POST", "/reset"):
            episode_id = str(request["episode_id"])
            if episode_id not in self.open_episode_ids:  # a retried reset is the same episode
                self.open_episode_ids.add(episode_id)
                self.episodes_reset += 1
            if fault == "hang":
                await asyncio.sleep(3600)
            if fault == "flaky":
                self.reset_attempts[episode_id] = self.reset_attempts.get(episode_id, 0) + 1
                if self.reset_attempts[episode_id] <= 2:
                    return 503, {"error": "warming up"}
            if len(self.episodes) >= self.max_episodes:
                self.episodes.pop(next(iter(self.episodes)))  # oldest first: abandoned episodes do not leak
            environment = self.environment_factory()
            observation = await environment.reset(request["task"])
            self.episodes[episode_id] = environment
            if fault == "huge-observation":
                observation = "x" * 1_000_000
            return 200, {"observation": observation, "info": {}}
        if route == ("POST", "/step"):
            environment = self.episodes.get(str(request["episode_id"]))
            if environment is None:
                return 404, {"error": "unknown episode_id"}
            await asyncio.sleep(3600 if fault == "hang-step" else self.latency_s)
            # Kept after done until /close (or evicted by max_episodes, for clients that never close).
            result = await environment.step(str(request["action"]))
            payload = {"observation": result.observation, "reward": result.reward, "done": result.done,
                       "info": result.info}
            if fault == "garbage-json":
                return 200, b"<html>502 Bad Gateway</html>"
            if fault == "missing-field":
                del payload["reward"]
            if fault == "wrong-type":
                payload["done"] = "yes"
            return 200, payload
        if route == ("POST", "/tool"):
            environment = self.episodes.get(str(request["episode_id"]))
            if environment is None:
                return 404, {"error": "unknown episode_id"}
            tool = next((tool for tool in environment.tools if tool.name == request["name"]), None)
            if tool is None:
                return 404, {"error": f"unknown tool {request['name']!r}"}
            await asyncio.sleep(self.latency_s)
            return 200, {"result": await tool.run(dict(request["arguments"]))}
        return 404, {"error": f"no route {method} {path}"}

    async def _demonstrations(self, query: dict[str, str], fault: str | None) -> list[dict[str, Any]]:
        seed, count = int(query["seed"]), int(query["count"])
        if not 0 <= count <= MAX_DEMONSTRATIONS:
            raise ValueError(f"count must be between 0 and {MAX_DEMONSTRATIONS}, got {count}")
        demonstrations = self._task_source.demonstrations(count, random.Random(seed))
        if inspect.isawaitable(demonstrations):
            demonstrations = await demonstrations
        served = [{"prompt": demonstration.prompt,
                   "turns": [{"role": turn.role, "text": turn.text} for turn in demonstration.turns]}
                  for demonstration in demonstrations]
        if fault == "bad-demonstrations":
            for demonstration in served:
                demonstration["turns"].append({"role": "narrator", "text": "and then"})
        return served


def demonstrations_dataset(environment: Environment, *, count: int, seed: int) -> str:
    """``count`` of ``environment``'s own demonstrations as a JSONL dataset in the common chat format.

    What a user who has demonstrations of a remote environment uploads (``POST /api/datasets/``):
    one conversation a line, its tool calls as OpenAI's ``tool_calls``, so that a run on a server
    without ``/demonstrations`` can SFT on them. ``seed`` draws the tasks.
    """
    from environments.tool_calls import demonstration_messages

    demonstrations = environment.demonstrations(count, random.Random(seed))
    if inspect.isawaitable(demonstrations):
        demonstrations = asyncio.run(demonstrations)
    lines = []
    for demonstration in demonstrations:
        messages = []
        for message in demonstration_messages(demonstration, environment.tools, "tandem"):
            if message.get("tool_calls"):
                # The call is the message: its text is written from tool_calls in the run's own format.
                message = {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])}}
                    for call in message["tool_calls"]]}
            messages.append(message)
        lines.append(json.dumps({"messages": messages}) + "\n")
    return "".join(lines)


class ServerNotHealthyError(RuntimeError):
    """A spawned example server did not answer ``/health`` in time."""


def spawn(*, latency_ms: float = 0.0, ready_timeout_s: float = 30.0, environment: str | None = None,
          settings: dict[str, Any] | None = None) -> tuple[subprocess.Popen, str]:
    """Run this server in a subprocess on a free local port; returns it and its URL once healthy.

    ``environment``: ``module:Class`` to serve instead of the calculator, built with ``settings``.
    """
    import httpx

    from tandem.runtime.local_ports import free_local_port

    port = free_local_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "environments.http_example_server", "--port", str(port),
         "--latency-ms", str(latency_ms),
         *(["--environment", environment, "--settings", json.dumps(settings or {})] if environment else [])],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + ready_timeout_s
    while process.poll() is None and time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).json() == {"status": "ok"}:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    process.wait()
    raise ServerNotHealthyError(f"the example environment server on {url} did not become healthy")


@contextlib.contextmanager
def running(**spawn_arguments: Any) -> Iterator[str]:
    """:func:`spawn` a server for the ``with`` block; yields its URL and stops it afterwards."""
    process, url = spawn(**spawn_arguments)
    try:
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main() -> None:
    import uvicorn

    from environments import load_environment_class
    from tandem.contracts import EnvironmentSpec

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--latency-ms", type=float, default=0.0, help="delay of every step and tool call")
    parser.add_argument("--environment", help="module:Class of the environment to serve (default: the calculator)")
    parser.add_argument("--settings", "--params", dest="settings", default="{}",
                        help="JSON object of the environment's settings (its constructor's keyword arguments)")
    parser.add_argument("--name", help="the name /schema reports (default: the class's name)")
    parser.add_argument("--write-dataset", type=int, metavar="N",
                        help="serve nothing: print N of the environment's demonstrations as a JSONL chat dataset")
    parser.add_argument("--seed", type=int, default=0, help="draws the tasks of --write-dataset")
    args = parser.parse_args()
    if args.environment:
        settings = json.loads(args.settings)
        environment_class = load_environment_class(EnvironmentSpec(
            name=args.environment, kind="python", entrypoint=args.environment, settings=settings))
        server = EnvironmentServer(lambda: environment_class(**settings), name=args.name or environment_class.__name__,
                                   latency_ms=args.latency_ms)
    else:
        server = EnvironmentServer(latency_ms=args.latency_ms)
    if args.write_dataset is not None:
        sys.stdout.write(demonstrations_dataset(server.environment_factory(), count=args.write_dataset, seed=args.seed))
        return
    uvicorn.run(server, host=args.host, port=args.port,
                # Hung requests (the "hang" fault) must not hold a shutdown forever.
                log_level="warning", timeout_graceful_shutdown=1)


if __name__ == "__main__":
    main()
