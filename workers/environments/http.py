"""An environment served over HTTP, in any language, on any machine.

The protocol (version 1, JSON bodies; docs/environments.md has the details):

- ``GET /health`` -> ``{"status": "ok"}``
- ``GET /schema`` -> ``{"name": str, "tools": [{"name", "description", "parameters"}], "protocol_version": 1}``
- ``POST /task`` ``{"seed": int}`` -> ``{"task": {...}}``; must be deterministic in ``seed``
- ``POST /reset`` ``{"task": {...}, "episode_id": str}`` -> ``{"observation": str, "info": {}}``
- ``POST /step`` ``{"episode_id": str, "action": str}`` -> ``{"observation": str, "reward": float, "done": bool, "info": {}}``
- ``POST /tool`` ``{"episode_id": str, "name": str, "arguments": {...}}`` -> ``{"result": str}``

``reset`` reads the schema first (the name and tools). In a producer, the
episodes of a process share kept-alive connections and one schema per URL a
minute (:class:`SharedHTTPClients`).

``sample_task`` must be synchronous and local (producers call it while
planning a group), so it only draws ``{"remote_seed": n}``; ``reset`` asks the server for the
task of that seed, and every episode of a GRPO group gets the same one.

Faults. Requests that change nothing (health, schema, task, reset of a fresh
episode id) are retried ``retries`` times with exponential backoff on
connection errors, timeouts and 5xx answers. ``step`` and ``/tool`` may have
been applied when an error comes back, so they are retried only when the
connection was refused or never established, i.e. the request was never
sent. A response that breaks the protocol, and an observation longer than
``max_observation_chars``, raise ``RemoteEnvironmentError``: the agent fails
the episode with that message as its reason.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import json
import random
import ssl
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from workers.environments.base import Environment, StepResult, Tool

PROTOCOL_VERSION = 1
_ERROR_BODY_CHARS = 200


class RemoteEnvironmentError(RuntimeError):
    """The remote environment answered outside the protocol, or not at all."""


def _require(payload: dict[str, Any], key: str, kinds: type | tuple[type, ...], *, where: str) -> Any:
    if key not in payload:
        raise RemoteEnvironmentError(f"{where}: response has no {key!r}")
    value = payload[key]
    # bool is an int in Python; a reward of true is a protocol error, not 1.0.
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in _as_tuple(kinds)):
        raise RemoteEnvironmentError(
            f"{where}: {key!r} is {type(value).__name__}, expected {' or '.join(k.__name__ for k in _as_tuple(kinds))}"
        )
    return value


def _as_tuple(kinds: type | tuple[type, ...]) -> tuple[type, ...]:
    return kinds if isinstance(kinds, tuple) else (kinds,)


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One TLS context per process, shared by every episode's client (SSLContext is thread-safe).

    httpx builds a new one for each client otherwise, loading the CA bundle
    every time, even for plain http://: about 15 ms of CPU per episode, which
    was 80% of a producer's CPU against the example server (py-spy, 200 ms
    latency, 96 episodes in flight).
    """
    return httpx.create_ssl_context()


# httpx's pool walks all of a client's connections, with a syscall for each, on every request:
# one client for 96 episodes cost 3.0 ms of CPU per request, a client per 4 episodes 0.7 ms
# (bench/http_clients.py).
EPISODES_PER_CLIENT = 4

# An episode has at most one request out, so a shared client needs no more connections than the
# episodes it serves. Idle ones close after 2 s, before common servers' own idle timeout
# (uvicorn's is 5 s), so a request never goes out on a connection the server is closing.
_SHARED_LIMITS = httpx.Limits(max_connections=None, max_keepalive_connections=EPISODES_PER_CLIENT,
                              keepalive_expiry=2.0)


@dataclasses.dataclass
class _Lease:
    client: httpx.AsyncClient
    episodes: int = 0


def _new_client(url: str, timeout_s: float, *, transport: httpx.AsyncBaseTransport | None = None,
                limits: httpx.Limits | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, timeout=timeout_s, transport=transport, verify=_tls_context(),
                             **({"limits": limits} if limits is not None else {}))


class SharedHTTPClients:
    """HTTP clients the episodes of one event loop share, per (URL, timeout), and the schema per URL.

    With a client of its own, each episode opened a new connection and asked
    for ``/schema`` on every reset: a TCP handshake and two of its four
    requests before the first observation, on the producer's CPU and on the
    environment server's. Shared clients keep connections alive between
    episodes (a client serves up to ``EPISODES_PER_CLIENT`` at once), and a
    URL's schema is fetched once per ``schema_ttl_s`` (concurrent resets wait
    for the same fetch; a failed fetch is not kept), so a server redeployed
    with other tools is seen within that time.

    The producer's episode loop (:mod:`workers.episode_loop`) sets
    :data:`shared_http_clients` for its episodes; anywhere else an environment
    uses a client of its own. Use an instance from one event loop only.
    """

    def __init__(self, *, schema_ttl_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.schema_ttl_s = schema_ttl_s
        self._clock = clock
        self._leases: dict[tuple[str, float], list[_Lease]] = {}
        self._schemas: dict[str, tuple[float, asyncio.Future]] = {}

    def lease(self, url: str, timeout_s: float) -> httpx.AsyncClient:
        """A client for one episode, shared with at most ``EPISODES_PER_CLIENT - 1`` others; :meth:`release` it."""
        leases = self._leases.setdefault((url, timeout_s), [])
        leases[:] = [lease for lease in leases if not lease.client.is_closed]
        least_used = min(leases, key=lambda lease: lease.episodes, default=None)
        if least_used is None or least_used.episodes >= EPISODES_PER_CLIENT:
            least_used = _Lease(_new_client(url, timeout_s, limits=_SHARED_LIMITS))
            leases.append(least_used)
        least_used.episodes += 1
        return least_used.client

    def release(self, client: httpx.AsyncClient) -> None:
        for leases in self._leases.values():
            for lease in leases:
                if lease.client is client:
                    lease.episodes -= 1
                    return

    def client_count(self) -> int:
        return sum(len(leases) for leases in self._leases.values())

    async def schema(self, url: str, fetch: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
        """``url``'s schema payload, fetched with ``fetch`` unless a recent one is cached."""
        cached = self._schemas.get(url)
        now = self._clock()
        if cached is None or now - cached[0] > self.schema_ttl_s:
            cached = self._schemas[url] = (now, asyncio.ensure_future(fetch()))
        fetching = cached[1]
        try:
            # Shielded: one episode timing out must not cancel the fetch others wait for.
            return await asyncio.shield(fetching)
        except BaseException:
            failed = fetching.done() and (fetching.cancelled() or fetching.exception() is not None)
            if failed and self._schemas.get(url) is cached:
                del self._schemas[url]
            raise

    async def aclose(self) -> None:
        leases, self._leases = [lease for leases in self._leases.values() for lease in leases], {}
        self._schemas.clear()
        for lease in leases:
            await lease.client.aclose()


#: The shared clients of the running episode, if its loop has any.
shared_http_clients: contextvars.ContextVar[SharedHTTPClients | None] = contextvars.ContextVar(
    "shared_http_clients", default=None
)


class RemoteHTTPEnvironment(Environment):
    """Registration: entrypoint ``workers.environments.http:RemoteHTTPEnvironment``,
    params ``{"url": "http://host:port", "timeout_s": 10, "max_observation_chars": 8192,
    "retries": 2, "backoff_s": 0.1}``."""

    def __init__(self, *, url: str, timeout_s: float = 10.0, max_observation_chars: int = 8192,
                 retries: int = 2, backoff_s: float = 0.1, transport: httpx.AsyncBaseTransport | None = None):
        """``transport`` replaces the network, for tests (``httpx.MockTransport``)."""
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url {url!r} must start with http:// or https://")
        if timeout_s <= 0 or max_observation_chars < 1 or retries < 0 or backoff_s < 0:
            raise ValueError("timeout_s and max_observation_chars must be positive, retries and backoff_s >= 0")
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_observation_chars = max_observation_chars
        self.retries = retries
        self.backoff_s = backoff_s
        self.tools: tuple[Tool, ...] = ()
        self.name: str | None = None
        self._episode_id: str | None = None
        self._client: httpx.AsyncClient | None = None
        self._owns_client = False
        self._shared: SharedHTTPClients | None = None
        self._transport = transport

    # -- transport ---------------------------------------------------------

    def _http(self) -> httpx.AsyncClient:
        # Created on first use: producers build an instance just to sample a task, never resetting it.
        if self._client is None:
            self._shared = shared_http_clients.get() if self._transport is None else None
            if self._shared is not None:
                self._client, self._owns_client = self._shared.lease(self.url, self.timeout_s), False
            else:
                self._client = _new_client(self.url, self.timeout_s, transport=self._transport)
                self._owns_client = True
        return self._client

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        if self._owns_client:
            await client.aclose()
        elif self._shared is not None:
            self._shared.release(client)

    async def _request(self, method: str, path: str, body: dict[str, Any] | None = None, *,
                       idempotent: bool) -> dict[str, Any]:
        where = f"{method} {path}"
        attempt = 0
        while True:
            try:
                response = await self._http().request(method, path, json=body)
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                # Never connected: nothing was sent, so even a step is safe to resend.
                error: Exception = exc
            except httpx.TransportError as exc:
                if not idempotent:
                    raise RemoteEnvironmentError(
                        f"{where}: {type(exc).__name__}: {exc} (not retried: it may have been applied)"
                    ) from exc
                error = exc
            else:
                if response.status_code < 500 or not idempotent:
                    return self._decode(response, where)
                error = RemoteEnvironmentError(f"{where}: HTTP {response.status_code}: "
                                               f"{response.text[:_ERROR_BODY_CHARS]}")
            if attempt >= self.retries:
                raise RemoteEnvironmentError(
                    f"{where} failed after {attempt + 1} attempts: {type(error).__name__}: {error}"
                ) from error
            await asyncio.sleep(self.backoff_s * 2**attempt)
            attempt += 1

    def _decode(self, response: httpx.Response, where: str) -> dict[str, Any]:
        if response.status_code != 200:
            raise RemoteEnvironmentError(
                f"{where}: HTTP {response.status_code}: {response.text[:_ERROR_BODY_CHARS]}"
            )
        try:
            payload = response.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RemoteEnvironmentError(
                f"{where}: response is not JSON ({exc}): {response.text[:_ERROR_BODY_CHARS]!r}"
            ) from exc
        if not isinstance(payload, dict):
            raise RemoteEnvironmentError(f"{where}: response is {type(payload).__name__}, expected an object")
        return payload

    def _observation(self, payload: dict[str, Any], key: str, where: str) -> str:
        observation = _require(payload, key, str, where=where)
        if len(observation) > self.max_observation_chars:
            raise RemoteEnvironmentError(
                f"{where}: {key} of {len(observation)} chars exceeds max_observation_chars="
                f"{self.max_observation_chars}"
            )
        return observation

    # -- protocol ----------------------------------------------------------

    async def health(self) -> bool:
        payload = await self._request("GET", "/health", idempotent=True)
        return payload.get("status") == "ok"

    async def fetch_schema(self) -> None:
        """Reads the environment's name and tools; ``reset`` calls it before the first observation."""
        where = "GET /schema"
        self._http()  # decides whether this episode's loop shares clients and schemas
        if self._shared is not None:
            payload = await self._shared.schema(
                self.url, lambda: self._request("GET", "/schema", idempotent=True))
        else:
            payload = await self._request("GET", "/schema", idempotent=True)
        version = _require(payload, "protocol_version", int, where=where)
        if version != PROTOCOL_VERSION:
            raise RemoteEnvironmentError(f"{where}: protocol_version {version}, this client speaks {PROTOCOL_VERSION}")
        self.name = _require(payload, "name", str, where=where)
        tools = []
        for index, declaration in enumerate(_require(payload, "tools", list, where=where)):
            at = f"{where} tools[{index}]"
            if not isinstance(declaration, dict):
                raise RemoteEnvironmentError(f"{at}: is {type(declaration).__name__}, expected an object")
            name = _require(declaration, "name", str, where=at)
            tools.append(Tool(
                name=name,
                description=str(declaration.get("description", "")),
                parameters=_require(declaration, "parameters", dict, where=at),
                run=self._remote_tool(name),
            ))
        self.tools = tuple(tools)

    def _remote_tool(self, name: str):
        async def run(arguments: dict[str, Any]) -> str:
            if self._episode_id is None:
                raise RemoteEnvironmentError(f"tool {name!r} called before reset()")
            body = {"episode_id": self._episode_id, "name": name, "arguments": arguments}
            payload = await self._request("POST", "/tool", body, idempotent=False)
            return self._observation(payload, "result", "POST /tool")
        return run

    def sample_task(self, rng: random.Random) -> dict[str, Any]:
        return {"remote_seed": rng.randrange(2**31)}

    async def reset(self, task: dict[str, Any]) -> str:
        await self.fetch_schema()
        if set(task) == {"remote_seed"}:
            payload = await self._request("POST", "/task", {"seed": task["remote_seed"]}, idempotent=True)
            task = _require(payload, "task", dict, where="POST /task")
        # Any other task is the server's own, e.g. from an evaluation set, and is sent as it is.
        # A fresh id per episode makes reset safe to retry: a server sees the same episode again.
        self._episode_id = uuid.uuid4().hex
        where = "POST /reset"
        payload = await self._request("POST", "/reset", {"task": task, "episode_id": self._episode_id},
                                      idempotent=True)
        observation = self._observation(payload, "observation", where)
        if not isinstance(payload.get("info", {}), dict):
            raise RemoteEnvironmentError(f"{where}: 'info' is not an object")
        return observation

    async def step(self, action: str) -> StepResult:
        if self._episode_id is None:
            raise RemoteEnvironmentError("step() called before reset()")
        where = "POST /step"
        payload = await self._request("POST", "/step", {"episode_id": self._episode_id, "action": action},
                                      idempotent=False)
        observation = self._observation(payload, "observation", where)
        reward = _require(payload, "reward", (int, float), where=where)
        done = _require(payload, "done", bool, where=where)
        info = payload.get("info", {})
        if not isinstance(info, dict):
            raise RemoteEnvironmentError(f"{where}: 'info' is {type(info).__name__}, expected an object")
        return StepResult(observation=observation, reward=float(reward), done=done, info=info)
