"""Finding 3 of the security audit: an environment URL reaches only what the operator allowed.

Real HTTP servers on loopback addresses (127.0.0.1 and 127.0.0.2, both on this
host's lo): a redirect is not followed, a name is checked where the worker
connects (so DNS rebinding fails), encoded IPv4 hosts are refused, and a failed
response's body is not echoed back.
"""

from __future__ import annotations

import asyncio
import ipaddress

import pytest
from aiohttp import web

from environments.adapters.http import RemoteEnvironmentError, RemoteHTTPEnvironment
from tandem.allowlists.environment_urls import (
    EnvironmentURLRefused,
    check_environment_url,
    effective_address,
)

SECRET = "internal-only-secret-body"


async def _serve(host: str, handler) -> tuple[web.AppRunner, int, list[str]]:
    seen: list[str] = []

    async def record(request):
        seen.append(request.path)
        response = handler(request)
        return await response if asyncio.iscoroutine(response) else response

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1], seen


def test_a_redirect_is_not_followed_and_its_target_never_asked(monkeypatch):
    monkeypatch.setenv("TANDEM_ENVIRONMENT_URL_ALLOWLIST", "127.0.0.1/32")

    async def scenario():
        inner, inner_port, inner_seen = await _serve(
            "127.0.0.2", lambda request: _text(SECRET))
        outer, outer_port, _ = await _serve(
            "127.0.0.1", lambda request: _redirect(f"http://127.0.0.2:{inner_port}/secret"))
        environment = RemoteHTTPEnvironment(url=f"http://127.0.0.1:{outer_port}", retries=0)
        try:
            with pytest.raises(RemoteEnvironmentError) as error:
                await environment.health()
        finally:
            await environment.close()
            await inner.cleanup()
            await outer.cleanup()
        return str(error.value), inner_seen

    message, inner_seen = asyncio.run(scenario())
    assert "HTTP 302" in message and SECRET not in message
    assert inner_seen == []


def test_a_name_that_resolves_outside_the_allow_list_is_refused_when_connecting(monkeypatch):
    # The registration check lets a name through (the platform may not see the workers' DNS);
    # the worker's resolver checks the address it is about to connect to.
    monkeypatch.setenv("TANDEM_ENVIRONMENT_URL_ALLOWLIST", "10.0.0.0/8")

    async def scenario():
        server, port, seen = await _serve("127.0.0.1", lambda request: _json({"status": "ok"}))
        environment = RemoteHTTPEnvironment(url=f"http://localhost:{port}", retries=2)
        try:
            with pytest.raises(RemoteEnvironmentError) as error:
                await environment.health()
        finally:
            await environment.close()
            await server.cleanup()
        return str(error.value), seen

    message, seen = asyncio.run(scenario())
    assert "not on the environment URL allow-list" in message and "attempts" not in message
    assert seen == []


def test_a_failed_response_shows_the_protocols_error_message_but_never_another_body():
    async def scenario():
        def handler(request):
            if request.path == "/health":
                return _text(SECRET, status=404)
            return _json({"error": "no such schema\x1b[31m"}, status=404)

        server, port, _ = await _serve("127.0.0.1", handler)
        environment = RemoteHTTPEnvironment(url=f"http://127.0.0.1:{port}", retries=0)
        try:
            errors = []
            for call in (environment.health(), environment.fetch_schema()):
                with pytest.raises(RemoteEnvironmentError) as error:
                    await call
                errors.append(str(error.value))
        finally:
            await environment.close()
            await server.cleanup()
        return errors

    health, schema = asyncio.run(scenario())
    assert SECRET not in health and "bytes, not the protocol's error object" in health
    assert "no such schema?[31m" in schema


@pytest.mark.parametrize("url", [
    "http://2852039166/", "http://0xa9fea9fe/", "http://0251.0376.0251.0376/", "http://169.254.43518/",
    "http://[::a9fe:a9fe]/", "http://[::ffff:a9fe:a9fe]/", "http://[64:ff9b::a9fe:a9fe]/",
    "http://[2002:a9fe:a9fe::]/",
    "http://envs.example.com:8765/?x=", "http://envs.example.com/#top",
    "http://user:password@envs.example.com/",
])
def test_encoded_metadata_addresses_queries_and_credentials_are_refused_at_registration(url):
    with pytest.raises(EnvironmentURLRefused):
        check_environment_url(url)


def test_embedded_ipv4_addresses_are_checked_as_the_ipv4_address_they_reach():
    metadata = ipaddress.ip_address("169.254.169.254")
    for embedded in ("::ffff:169.254.169.254", "::169.254.169.254", "64:ff9b::a9fe:a9fe",
                     "2002:a9fe:a9fe::1"):
        assert effective_address(ipaddress.ip_address(embedded)) == metadata
    assert effective_address(ipaddress.ip_address("::1")) == ipaddress.ip_address("::1")
    check_environment_url("http://envs.example.com:8765")  # a plain name and port still pass


def _text(body: str, status: int = 200) -> web.Response:
    return web.Response(text=body, status=status)


def _json(payload: dict, status: int = 200) -> web.Response:
    return web.json_response(payload, status=status)


def _redirect(location: str) -> web.Response:
    return web.Response(status=302, headers={"Location": location})


def test_where_private_addresses_are_refused_only_listed_ones_pass(monkeypatch):
    monkeypatch.setenv("TANDEM_ENVIRONMENT_URL_PRIVATE", "refuse")
    for url in ("http://10.1.2.3:8765", "http://127.0.0.1:8765", "http://[::ffff:192.168.1.1]/",
                "http://[fd00::1]/", "http://100.64.0.1/"):
        with pytest.raises(EnvironmentURLRefused, match="private or loopback"):
            check_environment_url(url)
    check_environment_url("http://10.1.2.3:8765", allowlist=["10.0.0.0/8"])
    check_environment_url("http://93.184.216.34/")  # a public address
    monkeypatch.setenv("TANDEM_ENVIRONMENT_URL_PRIVATE", "allow")  # development: the laptop's servers
    check_environment_url("http://127.0.0.1:8765")


def test_where_private_addresses_are_refused_a_name_resolving_to_one_is_refused_when_connecting(monkeypatch):
    monkeypatch.setenv("TANDEM_ENVIRONMENT_URL_PRIVATE", "refuse")
    monkeypatch.delenv("TANDEM_ENVIRONMENT_URL_ALLOWLIST", raising=False)

    async def scenario():
        server, port, seen = await _serve("127.0.0.1", lambda request: _json({"status": "ok"}))
        environment = RemoteHTTPEnvironment(url=f"http://localhost:{port}", retries=0)
        try:
            with pytest.raises(RemoteEnvironmentError, match="private or loopback"):
                await environment.health()
        finally:
            await environment.close()
            await server.cleanup()
        return seen

    assert asyncio.run(scenario()) == []
