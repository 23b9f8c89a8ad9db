"""A real MCP server for the tests: over stdio (``python tests/workers/mcp_arithmetic_server.py``), or
streamable HTTP on a loopback port (``... --http PORT``, at ``/mcp``).

``add`` answers, ``refuse`` always fails (the server's own error), and ``count`` counts its calls in
the server process: over stdio a new episode's server starts again from 1. Over HTTP the protocol
this ``mcp`` speaks (2026-07-28) has no sessions, so the count is the server's across episodes.
"""

from __future__ import annotations

import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("arithmetic")
calls = {"count": 0}


@server.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@server.tool()
def refuse(reason: str) -> str:
    """Always refuses."""
    raise ValueError(reason)


@server.tool()
def count() -> str:
    """How many times this server was asked to count."""
    calls["count"] += 1
    return str(calls["count"])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
