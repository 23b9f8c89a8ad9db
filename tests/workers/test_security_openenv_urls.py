"""Finding 3 of the security audit, for OpenEnv servers: their connections obey the environment URL policy.

Real OpenEnv servers (openenv-core's FastAPI app under uvicorn) on loopback
addresses (127.0.0.1 and 127.0.0.2, both on this host's lo). The adapter
checks the address it connects to when it connects, so a name that resolves
into a refused range then, or that was rebound after an earlier check, is
refused; a redirect of the WebSocket handshake is not followed.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import threading
from collections.abc import Iterator

import pytest
from aiohttp import web

from environments.adapters.openenv import OpenEnvEnvironment, OpenEnvError
from tandem.allowlists.environment_urls import check_environment_url, resolve_host
from tandem.runtime.local_ports import free_local_port
from tests.polling import poll_until

pytest.importorskip("openenv.core")


def _echo_game_app():
    from openenv.core.env_server.http_server import create_fastapi_app
    from openenv.core.env_server.interfaces import Environment as OpenEnvBase
    from openenv.core.env_server.types import Action, Observation, State

    class EchoAction(Action):
        message: str

    class EchoObservation(Observation):
        prompt: str = ""

    class EchoGame(OpenEnvBase):
        SUPPORTS_CONCURRENT_SESSIONS = True

        def reset(self, seed=None, episode_id=None, **kwargs):
            self.word = random.Random(seed).choice(["red", "green", "blue"])
            return EchoObservation(prompt=f"say {self.word}\n")

        def step(self, action, timeout_s=None, **kwargs):
            right = action.message.strip() == self.word
            return EchoObservation(prompt="" if right else "again\n", reward=1.0 if right else 0.0, done=right)

        @property
        def state(self):
            return State()

    return create_fastapi_app(EchoGame, EchoAction, EchoObservation, max_concurrent_envs=4)


@contextlib.contextmanager
def _openenv_server(host: str) -> Iterator[tuple[int, list[str]]]:
    """A real OpenEnv server on ``host``; yields its port and the paths of every request it received."""
    import uvicorn

    app = _echo_game_app()
    seen: list[str] = []

    async def recording(scope, receive, send):
        if scope["type"] in ("http", "websocket"):
            seen.append(scope["path"])
        await app(scope, receive, send)

    port = free_local_port()
    server = uvicorn.Server(uvicorn.Config(recording, host=host, port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    def serving() -> None:
        assert thread.is_alive(), f"the OpenEnv server on {host} exited"

    poll_until(lambda: server.started, timeout_s=20, interval_s=0.05, between=serving,
               what=f"the OpenEnv server on {host} to start")
    try:
        yield port, seen
    finally:
        server.should_exit = True
        thread.join(timeout=10)


async def _episode(url: str) -> tuple[str, float]:
    environment = OpenEnvEnvironment(url=url, observation_field="prompt", timeout_s=10)
    try:
        prompt = await environment.reset({"seed": 3})
        result = await environment.step(prompt.split()[1])
        return prompt, result.reward
    finally:
        await environment.close()


def test_openenv_connection_to_a_refused_address_fails_at_connect_time(monkeypatch):
    # 'localhost' passes the registration check as written (a name: the platform may not see the
    # workers' DNS); where private addresses are refused, the address it resolves to when the
    # adapter connects is loopback, and no byte reaches the server.
    monkeypatch.setenv("TANDEM_ENVIRONMENT_URL_PRIVATE", "refuse")
    monkeypatch.delenv("TANDEM_ENVIRONMENT_URL_ALLOWLIST", raising=False)
    with _openenv_server("127.0.0.1") as (port, seen):
        url = f"http://localhost:{port}"
        check_environment_url(url)
        with pytest.raises(OpenEnvError, match="private or loopback"):
            asyncio.run(_episode(url))
    assert seen == []


def test_openenv_name_outside_the_allow_list_is_refused_at_connect_time(monkeypatch):
    monkeypatch.setenv("TANDEM_ENVIRONMENT_URL_ALLOWLIST", "10.0.0.0/8")
    with _openenv_server("127.0.0.1") as (port, seen), \
            pytest.raises(OpenEnvError, match="not on the environment URL allow-list"):
        asyncio.run(_episode(f"http://localhost:{port}"))
    assert seen == []


def test_openenv_name_rebound_after_its_check_is_refused_at_connect_time(monkeypatch):
    # DNS rebinding: the name resolves to an allowed address when the probe checks it, then to a
    # refused one, where a second server listens, when the episode connects.
    monkeypatch.setenv("TANDEM_ENVIRONMENT_URL_ALLOWLIST", "127.0.0.1/32")
    answers = iter(["127.0.0.1", "127.0.0.2"])
    real_getaddrinfo = socket.getaddrinfo

    def rebinding_getaddrinfo(host, port, *args, **kwargs):
        if host == "openenv.rebind.test":
            host = next(answers, "127.0.0.2")
        return real_getaddrinfo(host, port, *args, **kwargs)

    with _openenv_server("127.0.0.1") as (_, first_seen), _openenv_server("127.0.0.2") as (port, rebound_seen):
        monkeypatch.setattr(socket, "getaddrinfo", rebinding_getaddrinfo)
        url = f"http://openenv.rebind.test:{port}"
        check_environment_url(url, allowlist=["127.0.0.1/32"], resolve=resolve_host)  # the probe's check
        with pytest.raises(OpenEnvError, match=r"openenv\.rebind\.test resolves to an address not on the environment URL allow-list"):
            asyncio.run(_episode(url))
    assert first_seen == [] and rebound_seen == []


def test_openenv_handshake_redirect_is_not_followed_and_its_target_never_asked(monkeypatch):
    monkeypatch.setenv("TANDEM_ENVIRONMENT_URL_ALLOWLIST", "127.0.0.1/32")

    async def scenario(inner_port: int) -> str:
        async def redirect(request):
            return web.Response(status=302, headers={"Location": f"ws://127.0.0.2:{inner_port}/ws"})

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", redirect)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        outer_port = site._server.sockets[0].getsockname()[1]
        try:
            with pytest.raises(ConnectionError) as error:
                await _episode(f"http://127.0.0.1:{outer_port}")
        finally:
            await runner.cleanup()
        return str(error.value)

    with _openenv_server("127.0.0.2") as (inner_port, inner_seen):
        message = asyncio.run(scenario(inner_port))
    assert "cannot follow redirect" in message
    assert inner_seen == []


def test_openenv_literal_address_in_a_refused_range_is_refused_before_any_connection():
    with pytest.raises(ValueError, match="link-local or cloud-metadata"):
        OpenEnvEnvironment(url="http://169.254.169.254:8000")
    with pytest.raises(ValueError, match="must not have a query"):
        OpenEnvEnvironment(url="http://envs.example.com:8000/?next=")


def test_an_allowed_openenv_server_plays_an_episode_through_the_checked_connection(monkeypatch):
    # Where private addresses are refused, a listed name resolving to loopback passes only with its
    # network listed too (issue 28, finding 13); the episode runs over the connection the adapter
    # opened to the checked address.
    monkeypatch.setenv("TANDEM_ENVIRONMENT_URL_PRIVATE", "refuse")
    monkeypatch.setenv("TANDEM_ENVIRONMENT_URL_ALLOWLIST", "localhost,127.0.0.1,::1")
    with _openenv_server("127.0.0.1") as (port, seen):
        prompt, reward = asyncio.run(_episode(f"http://localhost:{port}"))
    assert prompt.startswith("say ") and reward == 1.0
    assert seen == ["/ws"]
