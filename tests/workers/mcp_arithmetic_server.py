"""A real MCP server for the tests: over stdio (``python tests/workers/mcp_arithmetic_server.py``), or
streamable HTTP on a loopback port (``... --http PORT``, at ``/mcp``).

``add`` answers, ``refuse`` always fails (the server's own error), and ``count`` counts its calls per
session, as a stateful server keeps state: over stdio the process is the session (a new episode's server
starts again from 1); over HTTP it is the ``Mcp-Session-Id`` the server gave at the handshake. ``session``
answers that id (empty over stdio).
"""

from __future__ import annotations

import sys

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("arithmetic")
calls: dict[str, int] = {}


def _session_id(context: Context) -> str:
    request = context.request_context.request
    return (request.headers.get("mcp-session-id") if request is not None else None) or ""


@server.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@server.tool()
def refuse(reason: str) -> str:
    """Always refuses."""
    raise ValueError(reason)


@server.tool()
def count(context: Context) -> str:
    """How many times this session asked to count."""
    session = _session_id(context)
    calls[session] = calls.get(session, 0) + 1
    return str(calls[session])


@server.tool()
def session(context: Context) -> str:
    """The id of the caller's MCP session (empty over stdio)."""
    return _session_id(context)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
