"""Which MCP tool servers an environment registration may make a worker start: the operator's allow-list.

An environment may take its tools from an MCP server run as a subprocess over stdio. Starting a
process runs its code on every worker that probes or samples the environment, so a registration
never gives a command line: it names one the operator lists in ``TANDEM_MCP_SERVERS``, a JSON object
of name to argv, for example ``{"calculator": ["python", "-m", "my_team.mcp_calculator"]}``. The
platform refuses a registration that names any other (a 400 naming the field and this setting), and
workers refuse to start it. No shell runs the command, and it inherits only the few variables
``mcp`` deems safe (``PATH``, ``HOME`` ...), never the worker's secrets.
"""

from __future__ import annotations

import json
import os
import re

MCP_SERVERS_SETTING = "TANDEM_MCP_SERVERS"

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class McpServerRefused(ValueError):
    """The named MCP server is not one the operator lists."""


def configured_mcp_servers(configured: str | None = None) -> dict[str, tuple[str, ...]]:
    """The operator's servers, name to argv, from ``configured`` (default: the setting's variable).

    Raises:
      ValueError: the setting is not a JSON object of names to non-empty lists of strings.
    """
    if configured is None:
        configured = os.environ.get(MCP_SERVERS_SETTING, "")
    if not configured.strip():
        return {}
    try:
        servers = json.loads(configured)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{MCP_SERVERS_SETTING} is not JSON: {exc}") from None
    if not isinstance(servers, dict):
        raise ValueError(f"{MCP_SERVERS_SETTING} must be a JSON object of name to argv")
    checked = {}
    for name, argv in servers.items():
        if not _NAME.match(name):
            raise ValueError(f"{MCP_SERVERS_SETTING}: {name!r} is not a name of letters, digits, '_', '.', '-'")
        if not isinstance(argv, list) or not argv or not all(isinstance(part, str) and part for part in argv):
            raise ValueError(f"{MCP_SERVERS_SETTING}: {name!r} must be a non-empty list of strings (an argv)")
        checked[name] = tuple(argv)
    return checked


def check_mcp_server(name: str, *, servers: dict[str, tuple[str, ...]] | None = None) -> tuple[str, ...]:
    """The argv of the operator's server ``name``.

    Raises:
      McpServerRefused: the operator lists no server of that name; the message names the setting.
    """
    servers = configured_mcp_servers() if servers is None else servers
    argv = servers.get(name)
    if argv is None:
        listed = ", ".join(sorted(servers)) or "none"
        raise McpServerRefused(
            f"MCP server {name!r} is not one the operator allows (listed: {listed}); an operator adds it to "
            f"{MCP_SERVERS_SETTING}, a JSON object of name to argv")
    return argv
