"""An environment served over HTTP, in any language, on any machine.

The protocol (version 1, JSON bodies; docs/environments.md has the details):

- ``GET /health`` -> ``{"status": "ok"}``
- ``GET /schema`` -> ``{"name": str, "tools": [{"name", "description", "parameters"}], "protocol_version": 1,
  "demonstrations": bool}`` (``demonstrations`` optional, default false)
- ``POST /task`` ``{"seed": int}`` -> ``{"task": {...}}``; must be deterministic in ``seed``
- ``POST /reset`` ``{"task": {...}, "episode_id": str}`` -> ``{"observation": str, "info": {}}``
- ``POST /step`` ``{"episode_id": str, "action": str}`` -> ``{"observation": str, "reward": float, "done": bool, "info": {}}``
- ``POST /tool`` ``{"episode_id": str, "name": str, "arguments": {...}}`` -> ``{"result": str}``
- ``POST /close`` ``{"episode_id": str, "reason": str}`` -> ``{}``; optional: sent once for every
  episode whose ``/reset`` was sent, whatever ended it (``EpisodeCloseReason``). A server without
  the route (404 or 405) is remembered and not asked again; a failed close never fails the episode.
- ``GET /demonstrations?seed=<int>&count=<int>`` -> ``{"demonstrations": [{"prompt": str, "turns":
  [{"role": "policy" | "environment", "text": str}]}]}``, at most ``count``; only asked of a server
  whose schema says ``"demonstrations": true``

``reset`` reads the schema first (the name and tools). In a producer, the
episodes of a process share one session's kept-alive connections and one
schema per URL a minute (:class:`SharedHTTPSession`).

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
import ipaddress
import json
import random
import socket
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from environments.base import (
    DEMONSTRATION_ROLES,
    Demonstration,
    DemonstrationTurn,
    Environment,
    StepResult,
    Tool,
    evaluation_seed,
    training_seed,
)
from tandem.allowlists.environment_urls import (
    EnvironmentURLRefused,
    check_connect_addresses,
    check_environment_url,
    configured_allowlist,
)
from tandem.contracts import EpisodeCloseReason

PROTOCOL_VERSION = 1
# How a server that lacks an optional route answers it.
_NO_ROUTE_STATUSES = (404, 405)
_ERROR_BODY_CHARS = 200

# Idle kept-alive connections close after 2 s, before common servers' own idle timeout (uvicorn's is
# 5 s), so a request never goes out on a connection the server is closing.
_KEEPALIVE_S = 2.0


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


def error_message_excerpt(raw: bytes) -> str | None:
    """A response body's ``{"error": str}`` message, short and printable; None when it holds none. An
    arbitrary body is never echoed: whoever registered the URL reads the probe report, and the URL may
    reach a service they cannot."""
    try:
        message = json.loads(raw).get("error")
    except (ValueError, AttributeError):
        return None
    if not isinstance(message, str):
        return None
    return "".join(c if c.isprintable() else "?" for c in message[:_ERROR_BODY_CHARS])


def _body_excerpt(raw: bytes) -> str:
    """What a failed response may show of its body: its error message, else only its size."""
    message = error_message_excerpt(raw)
    return f"({len(raw)} bytes, not the protocol's error object)" if message is None else message


class EnvironmentAddressRefused(OSError):
    """A connection would reach an address environments may not use (tandem.allowlists.environment_urls)."""


class _CheckingResolver(aiohttp.ThreadedResolver):
    """Resolves as usual, then refuses addresses the allow-list does not allow, at connect time.

    Every connection an HTTP environment opens goes through it, so the
    address a name resolves to when connecting is the one checked (no DNS
    rebinding between a check and the connection).
    """

    def __init__(self, allowlist: list[str] | None):
        super().__init__()
        self._allowlist = allowlist

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET):
        resolved = await super().resolve(host, port, family)
        try:
            check_connect_addresses(host, [ipaddress.ip_address(entry["host"]) for entry in resolved],
                                    allowlist=self._allowlist)
        except EnvironmentURLRefused as exc:
            raise EnvironmentAddressRefused(str(exc)) from None
        return resolved


def _new_session() -> aiohttp.ClientSession:
    """A session on the running loop; timeouts are per request (:attr:`RemoteHTTPEnvironment.timeout`).

    aiohttp, not httpx: against the example server, a request cost 0.20 ms
    of CPU with one aiohttp session for 96 episodes, 0.66 ms with an httpx
    client per 4 episodes and 3.3 ms with one httpx client for all (httpx's
    pool walks every connection on each request; ``bench/http_clients.py``).
    Remote environment calls had been 43% of a producer's CPU (py-spy, 200
    ms latency): CPU the trainer shares when both run on one host.
    """
    # limit=0: no cap of the session's own; an episode has one request out at most, and the
    # producer's concurrency bounds the episodes.
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=_KEEPALIVE_S,
                                     resolver=_CheckingResolver(configured_allowlist()))
    return aiohttp.ClientSession(connector=connector)


class SharedHTTPSession:
    """One HTTP session for the episodes of one event loop, and the schema per URL.

    With a session of its own, each episode opened a new connection and
    asked for ``/schema`` on every reset: a TCP handshake and two of its four
    requests before the first observation, on the producer's CPU and on the
    environment server's. The shared session keeps connections alive between
    episodes, and a URL's schema is fetched once per ``schema_ttl_s``
    (concurrent resets wait for the same fetch; a failed fetch is not kept),
    so a server redeployed with other tools is seen within that time.

    The producer's episode loop (:mod:`workers.episode_loop`) sets
    :data:`shared_http_session` for its episodes; anywhere else an
    environment uses a session of its own. Use an instance from one event
    loop only: the session is made on that loop at first use.
    """

    def __init__(self, *, schema_ttl_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.schema_ttl_s = schema_ttl_s
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None
        self._schemas: dict[str, tuple[float, asyncio.Future]] = {}
        self._without_close: dict[str, float] = {}  # URL: when it answered /close with 404 or 405

    def lacks_close(self, url: str) -> bool:
        """Whether ``url`` answered ``/close`` as a server without the route, within ``schema_ttl_s``
        (a server redeployed with it is asked again after that time, as its schema is)."""
        since = self._without_close.get(url)
        return since is not None and self._clock() - since <= self.schema_ttl_s

    def remember_no_close(self, url: str) -> None:
        self._without_close[url] = self._clock()

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = _new_session()
        return self._session

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
        session, self._session = self._session, None
        self._schemas.clear()
        self._without_close.clear()
        if session is not None:
            await session.close()


#: The shared session of the running episode, if its loop has one.
shared_http_session: contextvars.ContextVar[SharedHTTPSession | None] = contextvars.ContextVar(
    "shared_http_session", default=None
)


def checked_remote_url(url: str) -> str:
    """``url`` without its trailing slash, if a remote environment or agent service may live there.

    A literal address never reaches the resolver's connect-time check (:class:`_CheckingResolver`),
    so the URL is checked here too. Raises ValueError naming ``url``.
    """
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"url {url!r} must start with http:// or https://")
    try:
        check_environment_url(url, allowlist=configured_allowlist())
    except EnvironmentURLRefused as exc:
        raise ValueError(f"url: {exc}") from None
    return url.rstrip("/")


class RemoteHTTPEnvironment(Environment):
    """Registration: entrypoint ``environments.adapters.http:RemoteHTTPEnvironment``,
    settings ``{"url": "http://host:port", "timeout_s": 10, "max_observation_chars": 8192,
    "retries": 2, "backoff_s": 0.1}``.

    ``timeout_s`` bounds connecting and each wait for the server's bytes, not
    the whole request (the agent's ``environment_timeout_s`` does that).
    """

    def __init__(self, *, url: str, timeout_s: float = 10.0, max_observation_chars: int = 8192,
                 retries: int = 2, backoff_s: float = 0.1):
        url = checked_remote_url(url)
        if timeout_s <= 0 or max_observation_chars < 1 or retries < 0 or backoff_s < 0:
            raise ValueError("timeout_s and max_observation_chars must be positive, retries and backoff_s >= 0")
        self.url = url.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=None, connect=timeout_s, sock_read=timeout_s)
        self.max_observation_chars = max_observation_chars
        self.retries = retries
        self.backoff_s = backoff_s
        self.tools: tuple[Tool, ...] = ()
        self.name: str | None = None
        # Whether the schema advertises GET /demonstrations.
        self.serves_demonstrations = False
        self._lacks_close = False  # this instance's server answered /close as one without the route
        self._episode_id: str | None = None
        self._own_session: aiohttp.ClientSession | None = None
        self._shared: SharedHTTPSession | None = None

    # -- transport ---------------------------------------------------------

    def _http(self) -> aiohttp.ClientSession:
        # Made on first use, on the running loop: producers build an instance just to sample a
        # task, never resetting it.
        if self._shared is None and self._own_session is None:
            self._shared = shared_http_session.get()
        if self._shared is not None:
            return self._shared.session()
        if self._own_session is None:
            self._own_session = _new_session()
        return self._own_session

    async def close(self) -> None:
        session, self._own_session = self._own_session, None
        if session is not None:
            await session.close()

    async def _request(self, method: str, path: str, body: dict[str, Any] | None = None, *,
                       idempotent: bool, where: str | None = None) -> dict[str, Any]:
        where = where or f"{method} {path}"
        return self._decode(*await self._exchange(method, path, body, idempotent=idempotent, where=where), where)

    async def _exchange(self, method: str, path: str, body: dict[str, Any] | None, *,
                        idempotent: bool, where: str) -> tuple[int, bytes]:
        """The status and body of the request's last attempt; retries as the module docstring says."""
        attempt = 0
        while True:
            try:
                # Redirects are not followed: each hop would be a URL nobody checked.
                async with self._http().request(method, self.url + path, json=body,
                                                timeout=self.timeout,
                                                allow_redirects=False) as response:
                    status, raw = response.status, await response.read()
            except aiohttp.ClientConnectorError as exc:
                if isinstance(exc.os_error, EnvironmentAddressRefused):
                    raise RemoteEnvironmentError(f"{where}: {exc.os_error}") from None
                # Never connected: nothing was sent, so even a step is safe to resend.
                error: Exception = exc
            except aiohttp.ConnectionTimeoutError as exc:
                error = exc
            except (aiohttp.ClientError, TimeoutError) as exc:
                # Reported as the server's failure, not as the agent's own environment timeout.
                if not idempotent:
                    raise RemoteEnvironmentError(
                        f"{where}: {type(exc).__name__}: {exc} (not retried: it may have been applied)"
                    ) from exc
                error = exc
            else:
                if status < 500 or not idempotent:
                    return status, raw
                error = RemoteEnvironmentError(f"{where}: HTTP {status}: {_body_excerpt(raw)}")
            if attempt >= self.retries:
                raise RemoteEnvironmentError(
                    f"{where} failed after {attempt + 1} attempts: {type(error).__name__}: {error}"
                ) from error
            await asyncio.sleep(self.backoff_s * 2**attempt)
            attempt += 1

    def _decode(self, status: int, raw: bytes, where: str) -> dict[str, Any]:
        if status != 200:
            raise RemoteEnvironmentError(f"{where}: HTTP {status}: {_body_excerpt(raw)}")
        try:
            payload = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise RemoteEnvironmentError(
                f"{where}: response is not JSON ({exc}): {_body_excerpt(raw)}"
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
        self._http()  # decides whether this episode's loop shares a session and schemas
        if self._shared is not None:
            payload = await self._shared.schema(
                self.url, lambda: self._request("GET", "/schema", idempotent=True))
        else:
            payload = await self._request("GET", "/schema", idempotent=True)
        version = _require(payload, "protocol_version", int, where=where)
        if version != PROTOCOL_VERSION:
            raise RemoteEnvironmentError(f"{where}: protocol_version {version}, this client speaks {PROTOCOL_VERSION}")
        self.name = _require(payload, "name", str, where=where)
        self.serves_demonstrations = _require(payload, "demonstrations", bool, where=where) \
            if "demonstrations" in payload else False
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
        return {"remote_seed": training_seed(rng)}

    def sample_evaluation_task(self, rng: random.Random) -> dict[str, Any]:
        return {"remote_seed": evaluation_seed(rng), "split": "evaluation"}

    async def reset(self, task: dict[str, Any]) -> str:
        await self.fetch_schema()
        if set(task) <= {"remote_seed", "split"} and "remote_seed" in task:
            # A server with a held-out set of its own serves it for "split": "evaluation"; any
            # other keeps the split by the seed, which Tandem draws from a range of its own.
            request = {"seed": task["remote_seed"], "split": task.get("split", "train")}
            payload = await self._request("POST", "/task", request, idempotent=True)
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

    async def close_episode(self, reason: EpisodeCloseReason) -> None:
        """``POST /close`` for the episode whose ``/reset`` was sent, once; a server without the
        route is remembered (per shared session and URL) and not asked again.

        Raises RemoteEnvironmentError for any other failure: the agent logs and counts it.
        """
        episode_id, self._episode_id = self._episode_id, None
        if episode_id is None or self._lacks_close or (self._shared is not None and self._shared.lacks_close(self.url)):
            return
        where = "POST /close"
        # Idempotent: closing an episode again, or one the server never saw, is answered 200.
        status, raw = await self._exchange("POST", "/close", {"episode_id": episode_id, "reason": str(reason)},
                                           idempotent=True, where=where)
        if status in _NO_ROUTE_STATUSES:
            if self._shared is not None:
                self._shared.remember_no_close(self.url)
            self._lacks_close = True
            return
        if not 200 <= status < 300:  # the body of a success is the server's own
            raise RemoteEnvironmentError(f"{where}: HTTP {status}: {_body_excerpt(raw)}")

    async def demonstrations(self, count: int, rng: random.Random) -> list[Demonstration]:
        """``GET /demonstrations`` with a seed drawn from ``rng``, when the schema advertises it; else []."""
        await self.fetch_schema()  # its tools too: the demonstrations' tool calls are rewritten with them
        if not self.serves_demonstrations or count < 1:
            return []
        seed = rng.randrange(2**31)
        where = "GET /demonstrations"
        payload = await self._request("GET", f"/demonstrations?seed={seed}&count={count}", idempotent=True,
                                      where=where)
        entries = _require(payload, "demonstrations", list, where=where)
        if len(entries) > count:
            raise RemoteEnvironmentError(f"{where}: {len(entries)} demonstrations, more than count={count}")
        return [_demonstration(entry, f"{where} demonstrations[{index}]") for index, entry in enumerate(entries)]


def _demonstration(entry: Any, where: str) -> Demonstration:
    if not isinstance(entry, dict):
        raise RemoteEnvironmentError(f"{where}: is {type(entry).__name__}, expected an object")
    prompt = _require(entry, "prompt", str, where=where)
    turns = []
    for index, turn in enumerate(_require(entry, "turns", list, where=where)):
        at = f"{where} turns[{index}]"
        if not isinstance(turn, dict):
            raise RemoteEnvironmentError(f"{at}: is {type(turn).__name__}, expected an object")
        role = _require(turn, "role", str, where=at)
        if role not in DEMONSTRATION_ROLES:
            raise RemoteEnvironmentError(f"{at}: 'role' is {role!r}, expected {' or '.join(DEMONSTRATION_ROLES)}")
        turns.append(DemonstrationTurn(role=role, text=_require(turn, "text", str, where=at)))
    return Demonstration(prompt=prompt, turns=tuple(turns))
