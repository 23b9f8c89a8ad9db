"""Tools from an MCP server: an environment whose registration names a ``tool_server`` gets its tools from it.

Each episode opens its own session when it resets, lists the server's tools and adds them to the
environment's own, and ends the session when the episode closes:

- a ``command`` names one of the operator's servers (``TANDEM_MCP_SERVERS``,
  tandem/allowlists/mcp_servers.py), started over stdio for the episode and stopped with it, so a
  stateful server never carries one episode's state into another;
- a ``url`` is a streamable-HTTP server: the episode opens an MCP session of its own with the
  initialize handshake (the server gives it an ``Mcp-Session-Id``, to which a stateful server ties its
  state) and terminates it at its end (``DELETE``), so the next episode's session starts from nothing.
  The sessionless revision (2026-07-28), which ``mcp`` would otherwise pick, has no such scope; a
  server that speaks only that revision does not start, and says so. Every connection is checked
  where it is made, against the rules of HTTP environments'
  URLs (tandem/allowlists/environment_urls.py, ``TANDEM_ENVIRONMENT_URL_ALLOWLIST``), on the address
  the name resolves to then, which is the address connected to; proxies from the environment are not
  used, and redirects leave neither the endpoint's origin (``mcp``'s own rule) nor that check.

A call goes to the server and its text comes back as the tool's result. A call the server refuses (``isError``), a
server that died or a call past its timeout raises :class:`~environments.base.ToolError`: the agent
gives the policy that message and the episode goes on.

The client's streams live in one task of the episode's event loop, started at reset and ended at
close, because ``mcp``'s transports must be entered and left in the same task; calls come from
whichever task runs the tool.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import socket
import sys
from typing import Any

from environments.base import Environment, Tool, ToolError
from tandem.allowlists.environment_urls import (
    EnvironmentURLRefused,
    check_connect_addresses,
    configured_allowlist,
)
from tandem.allowlists.mcp_servers import check_mcp_server
from tandem.contracts import ToolServerSpec

logger = logging.getLogger(__name__)

#: How long a server may take to start and list its tools, and to answer one call.
START_TIMEOUT_S = 30.0
CALL_TIMEOUT_S = 60.0


class McpServerError(RuntimeError):
    """The episode's MCP server could not be started or did not list its tools."""


class McpToolSession:
    """One episode's connection to an MCP server: its tools, their calls, and its end."""

    def __init__(self, server: ToolServerSpec, *, start_timeout_s: float = START_TIMEOUT_S,
                 call_timeout_s: float = CALL_TIMEOUT_S):
        self._server = server
        self._argv = check_mcp_server(server.command) if server.command is not None else None
        self._name = server.label
        self._start_timeout_s = start_timeout_s
        self._call_timeout_s = call_timeout_s
        self._client = None
        self._closing: asyncio.Event | None = None
        self._owner: asyncio.Task | None = None

    async def open(self) -> tuple[Tool, ...]:
        """Start the server and list its tools, each as a :class:`Tool` that calls it.

        Raises:
          McpServerError: the server did not start, or did not list its tools, within the start timeout.
        """
        ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self._closing = asyncio.Event()
        self._owner = asyncio.create_task(self._serve(ready), name=f"mcp server {self._name}")
        try:
            listed = await asyncio.wait_for(asyncio.shield(ready), self._start_timeout_s)
        except TimeoutError:
            await self.close()
            raise McpServerError(f"MCP server {self._name!r} did not list its tools within "
                                 f"{self._start_timeout_s:g}s") from None
        except Exception as exc:
            await self.close()
            raise McpServerError(f"MCP server {self._name!r} did not start: {_reason(exc)}") from exc
        return tuple(Tool(name=tool.name, description=tool.description or "",
                          parameters=dict(tool.input_schema), run=self._caller(tool.name))
                     for tool in listed)

    def _transport(self, stack: contextlib.AsyncExitStack):
        """The client transport of this session's server."""
        if self._argv is None:
            from mcp.client.streamable_http import streamable_http_client

            http = _checked_http_client()
            stack.push_async_callback(http.aclose)
            return streamable_http_client(self._server.url, http_client=http)
        from mcp.client.stdio import StdioServerParameters, stdio_client

        command, *arguments = self._argv
        # env None: only the variables mcp deems safe to inherit, never the worker's own secrets. The
        # server's stderr goes to the process's own (a worker's log): a Celery worker's sys.stderr is a
        # logging proxy with no file descriptor for a subprocess to write to.
        return stdio_client(StdioServerParameters(command=command, args=list(arguments)), errlog=_stderr())

    async def _serve(self, ready: asyncio.Future) -> None:
        from mcp.client import Client

        try:
            async with contextlib.AsyncExitStack() as stack:
                # A URL server gets the handshake (a session per episode, see the module docstring).
                mode = "auto" if self._argv is not None else "legacy"
                client = await stack.enter_async_context(Client(self._transport(stack), cache=None, mode=mode))
                listed = await client.list_tools()
                self._client = client
                ready.set_result(listed.tools)
                await self._closing.wait()
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else McpServerError(repr(exc)))
            elif not isinstance(exc, asyncio.CancelledError):
                logger.warning("MCP server %r ended with an error", self._name, exc_info=True)
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            self._client = None

    def _caller(self, name: str):
        async def call(arguments: dict[str, Any]) -> str:
            client = self._client
            if client is None:
                raise ToolError(f"the MCP server {self._name!r} is not running")
            try:
                result = await asyncio.wait_for(client.call_tool(name, arguments), self._call_timeout_s)
            except TimeoutError:
                raise ToolError(f"the MCP server did not answer within {self._call_timeout_s:g}s") from None
            except Exception as exc:
                raise ToolError(f"the MCP server failed: {_reason(exc)}") from None
            text = "\n".join(_content_text(part) for part in result.content)
            if result.is_error:
                raise ToolError(text or "the MCP server refused the call")
            return text

        return call

    async def close(self) -> None:
        """Stop the server; safe to call more than once, and after a failed open."""
        if self._closing is not None:
            self._closing.set()
        owner, self._owner = self._owner, None
        if owner is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(owner), self._start_timeout_s)
        except TimeoutError:
            owner.cancel()
            with contextlib.suppress(BaseException):
                await owner
        except Exception:
            pass  # _serve logged it or handed it to open()


class McpAddressRefused(OSError):
    """A connection to an MCP server's URL would reach an address environments may not use."""


def _checked_http_client():
    """An HTTP client whose every connection resolves its host, checks each address against the URL rules
    (:func:`~tandem.allowlists.environment_urls.check_connect_addresses`) and connects to the checked one."""
    import httpcore2
    import httpx2
    from mcp.shared._httpx_utils import MCP_DEFAULT_SSE_READ_TIMEOUT, MCP_DEFAULT_TIMEOUT

    allowlist = configured_allowlist()

    class CheckingBackend(httpcore2.AnyIOBackend):
        async def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
            found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
            addresses = [ipaddress.ip_address(entry[4][0]) for entry in found]
            try:
                check_connect_addresses(host, addresses, allowlist=allowlist)
            except EnvironmentURLRefused as exc:
                raise McpAddressRefused(str(exc)) from None
            # The address checked is the address connected to: no second lookup to rebind.
            return await super().connect_tcp(str(addresses[0]), port, timeout=timeout,
                                             local_address=local_address, socket_options=socket_options)

    transport = httpx2.AsyncHTTPTransport(trust_env=False)
    # httpx2's transport takes no network backend; the connection pool under it does.
    transport._pool = httpcore2.AsyncConnectionPool(ssl_context=httpx2.create_ssl_context(trust_env=False),
                                                    network_backend=CheckingBackend())
    return httpx2.AsyncClient(transport=transport, trust_env=False,
                              timeout=httpx2.Timeout(MCP_DEFAULT_TIMEOUT, read=MCP_DEFAULT_SSE_READ_TIMEOUT))


def _stderr():
    """A stream with a file descriptor for the server's stderr: the process's original one, else /dev/null."""
    stream = sys.__stderr__
    try:
        if stream is not None:
            stream.fileno()
            return stream
    except (AttributeError, OSError, ValueError):
        pass
    return open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process


def _content_text(part: Any) -> str:
    """A result's content part as text: its text, or what kind of content it was."""
    text = getattr(part, "text", None)
    return text if isinstance(text, str) else f"[{getattr(part, 'type', 'unknown')} content]"


def _reason(exc: BaseException) -> str:
    """What went wrong, from the first leaf of an exception group (anyio's task groups raise them)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return str(exc) or type(exc).__name__


def with_mcp_tools(cls: type[Environment], server: ToolServerSpec) -> type[Environment]:
    """``cls`` whose episodes also get ``server``'s tools: started at reset, stopped at close."""

    class WithMcpTools(cls):
        async def reset(self, task: dict[str, Any]) -> str:
            await self._mcp_close()
            own = getattr(self, "_own_tools", None)
            if own is None:
                self._own_tools = own = tuple(self.tools)
            session = McpToolSession(server)
            self._mcp_session = session
            served = await session.open()
            clashing = sorted({tool.name for tool in own} & {tool.name for tool in served})
            if clashing:
                raise McpServerError(f"MCP server {server.label!r} serves tools the environment has itself: "
                                     f"{', '.join(clashing)}")
            self.tools = (*own, *served)
            return await super().reset(task)

        async def close(self) -> None:
            try:
                await super().close()
            finally:
                await self._mcp_close()

        async def _mcp_close(self) -> None:
            session = getattr(self, "_mcp_session", None)
            self._mcp_session = None
            if session is not None:
                await session.close()

    WithMcpTools.__name__ = WithMcpTools.__qualname__ = cls.__name__
    WithMcpTools.__module__ = cls.__module__
    WithMcpTools.__doc__ = cls.__doc__
    return WithMcpTools
