"""A real MCP server over stdio for the tests (``python tests/workers/mcp_arithmetic_server.py``).

``add`` answers, ``refuse`` always fails (the server's own error), and ``count`` counts its calls in
the server process: a new episode's server starts again from 1.
"""

from __future__ import annotations

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
    server.run("stdio")
