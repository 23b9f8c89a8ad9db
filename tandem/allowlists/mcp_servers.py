"""Which MCP tool servers an environment registration may make a worker start: the operator's allow-list.

An environment may take its tools from an MCP server run as a subprocess over stdio. A registration
names one the operator lists in ``TANDEM_MCP_SERVERS``, a JSON object of name to argv
(:mod:`tandem.allowlists.named_commands`). The server inherits only the few variables ``mcp`` deems
safe (``PATH``, ``HOME`` ...), never the worker's secrets.
"""

from __future__ import annotations

from tandem.allowlists.named_commands import (
    NamedCommandRefused,
    check_named_command,
    configured_named_commands,
)

MCP_SERVERS_SETTING = "TANDEM_MCP_SERVERS"


class McpServerRefused(NamedCommandRefused):
    """The named MCP server is not one the operator lists."""


def configured_mcp_servers(configured: str | None = None) -> dict[str, tuple[str, ...]]:
    """The operator's servers, name to argv (:func:`~tandem.allowlists.named_commands.configured_named_commands`)."""
    return configured_named_commands(MCP_SERVERS_SETTING, configured)


def check_mcp_server(name: str, *, servers: dict[str, tuple[str, ...]] | None = None) -> tuple[str, ...]:
    """The argv of the operator's server ``name``; raises McpServerRefused naming the setting."""
    return check_named_command(name, setting=MCP_SERVERS_SETTING, what="MCP server", commands=servers,
                               refusal=McpServerRefused)
