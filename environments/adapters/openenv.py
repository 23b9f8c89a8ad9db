"""Environments served by OpenEnv (``pip install openenv-core``), over its WebSocket session API.

OpenEnv actions and observations are JSON objects; Tandem's are text. The
policy's text becomes the action ``{action_field: text}``; the observation
shown to the policy is ``observation[observation_field]``, or, when
``observation_field`` is None, the observation object as JSON (without
``reward``, ``done`` and ``metadata``, which OpenEnv reports separately). A
task is a seed passed to OpenEnv's ``reset``, so a GRPO group shares it when
the server's environment honours seeds.

One WebSocket session per episode: OpenEnv servers keep an environment
instance per connection, so concurrent episodes never share state. ``close``
ends it the way the server expects: it sends OpenEnv's ``{"type": "close"}``
and waits for the server to close the connection, then closes its side.
openenv-core's own client closes first, and its server, ending the session,
then sends its close frame to a closed connection and logs the
``WebSocketDisconnect`` traceback of every episode.

The server's URL obeys the same policy as an HTTP environment's
(:mod:`tandem.allowlists.environment_urls`): checked as written when the adapter is
built, and again where the connection is made. openenv-core's client would
hand the URL to ``websockets``, which resolves the name itself, follows up to
ten redirects and goes through any proxy the environment names, none of it
checked; so the adapter opens the connection: it resolves the name with the
HTTP adapter's checking resolver, connects a socket to an address that was
checked, and gives that socket to ``websockets``, which then follows no
redirect (a redirect would need a new connection) and uses no proxy.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import socket
from typing import Any

from environments.adapters.http import EnvironmentAddressRefused, _CheckingResolver
from environments.base import Environment, StepResult, evaluation_seed, training_seed
from tandem.allowlists.environment_urls import (
    EnvironmentURLRefused,
    check_environment_url,
    configured_allowlist,
)

_REPORTED_SEPARATELY = {"reward", "done", "metadata"}
# How long close waits for the server to end the session (it answers a step in flight first).
_CLOSE_WAIT_S = 5.0


class OpenEnvError(RuntimeError):
    """The OpenEnv server may not be reached, or its answer cannot become a Tandem observation."""


async def _checked_socket(host: str, port: int) -> socket.socket:
    """A socket connected to an address of ``host`` that the environment URL policy allows.

    Every address the name resolves to is checked first, as for an HTTP
    environment (any refused one refuses the name); then each is tried in turn.
    """
    resolver = _CheckingResolver(configured_allowlist())
    try:
        resolved = await resolver.resolve(host, port, family=socket.AF_UNSPEC)
    finally:
        await resolver.close()
    loop = asyncio.get_running_loop()
    error: OSError = OSError(f"{host} resolved to no address")
    for entry in resolved:
        sock = socket.socket(entry["family"], socket.SOCK_STREAM, entry["proto"])
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, (entry["host"], entry["port"]))
        except OSError as exc:
            sock.close()
            error = exc
            continue
        except BaseException:
            sock.close()
            raise
        return sock
    raise error


@functools.cache
def _checked_client_class() -> type:
    """openenv-core's generic client, connecting only through :func:`_checked_socket`."""
    from openenv.core.generic_client import GenericEnvClient
    from websockets.asyncio.client import connect as websocket_connect
    from websockets.exceptions import ConnectionClosed
    from websockets.uri import parse_uri

    class CheckedEnvClient(GenericEnvClient):
        # Replaces EnvClient.connect, which every message's _ensure_connected calls too: no
        # connection of this client is opened any other way.
        async def connect(self) -> CheckedEnvClient:
            if self._ws is not None:
                return self
            uri = parse_uri(self._ws_url)
            try:
                # One deadline for resolving, connecting and the opening handshake.
                async with asyncio.timeout(self._connect_timeout):
                    sock = await _checked_socket(uri.host, uri.port)
                    try:
                        # With a socket of ours websockets uses no proxy and refuses every
                        # redirect; for wss:// it checks the certificate against uri.host.
                        self._ws = await websocket_connect(self._ws_url, sock=sock, proxy=None,
                                                           open_timeout=None, max_size=self._max_message_size)
                    except BaseException:
                        sock.close()
                        raise
            except EnvironmentAddressRefused as exc:
                raise OpenEnvError(f"connect {self._ws_url}: {exc}") from None
            except Exception as exc:
                raise ConnectionError(f"Failed to connect to {self._ws_url}: {exc}") from exc
            return self

        # Replaces EnvClient.disconnect (which close calls), which closed the connection first.
        async def disconnect(self) -> None:
            ws, self._ws = self._ws, None
            if ws is None:
                return
            try:
                await ws.send(json.dumps({"type": "close"}))
                # The server ends the session and starts the closing handshake; a message still
                # on its way (the answer to a cancelled step) is discarded with the connection.
                async with asyncio.timeout(min(self._message_timeout, _CLOSE_WAIT_S)):
                    await ws.wait_closed()
            except (TimeoutError, ConnectionClosed):
                pass  # a server that does not end it is closed on below; one that went away is gone
            finally:
                await ws.close()

    return CheckedEnvClient


class OpenEnvEnvironment(Environment):
    """Registration: entrypoint ``environments.adapters.openenv:OpenEnvEnvironment``, settings
    ``{"url": "http://host:8000", "action_field": "message", "observation_field": "echoed_message",
    "timeout_s": 30, "max_observation_chars": 8192}``."""

    def __init__(self, *, url: str, action_field: str = "message", observation_field: str | None = None,
                 timeout_s: float = 30.0, max_observation_chars: int = 8192):
        # A literal address is checked by the resolver too; this also refuses what no resolver
        # sees: another scheme, a query, credentials, a numeric host in another form.
        try:
            check_environment_url(url, allowlist=configured_allowlist())
        except EnvironmentURLRefused as exc:
            raise ValueError(f"url: {exc}") from None
        self.url = url.rstrip("/")
        self.action_field = action_field
        self.observation_field = observation_field
        self.timeout_s = timeout_s
        self.max_observation_chars = max_observation_chars
        self._client: Any = None

    def sample_task(self, rng: random.Random) -> dict[str, Any]:
        return {"seed": training_seed(rng)}

    def sample_evaluation_task(self, rng: random.Random) -> dict[str, Any]:
        return {"seed": evaluation_seed(rng)}

    def _text(self, observation: Any, where: str) -> str:
        if not isinstance(observation, dict):
            raise OpenEnvError(f"{where}: observation is {type(observation).__name__}, expected an object")
        if self.observation_field is None:
            visible = {k: v for k, v in observation.items() if k not in _REPORTED_SEPARATELY}
            text = json.dumps(visible, sort_keys=True) + "\n"
        elif self.observation_field not in observation:
            raise OpenEnvError(f"{where}: observation has no {self.observation_field!r}: {sorted(observation)}")
        else:
            text = str(observation[self.observation_field])
        if len(text) > self.max_observation_chars:
            raise OpenEnvError(f"{where}: observation of {len(text)} chars exceeds max_observation_chars="
                               f"{self.max_observation_chars}")
        return text

    async def reset(self, task: dict[str, Any]) -> str:
        self._client = _checked_client_class()(base_url=self.url, connect_timeout_s=self.timeout_s,
                                               message_timeout_s=self.timeout_s)
        await self._client.connect()
        result = await self._client.reset(seed=task.get("seed"))
        return self._text(result.observation, "reset")

    async def step(self, action: str) -> StepResult:
        if self._client is None:
            raise RuntimeError("step() called before reset()")
        result = await self._client.step({self.action_field: action})
        reward = result.reward
        if reward is not None and (isinstance(reward, bool) or not isinstance(reward, int | float)):
            raise OpenEnvError(f"step: reward is {type(reward).__name__}, expected a number")
        observation = result.observation
        return StepResult(self._text(observation, "step"), float(reward or 0.0), bool(result.done),
                          dict(observation.get("metadata") or {}))

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()
