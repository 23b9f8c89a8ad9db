"""Programs an operator lets workers start by name: a JSON object of name to argv in a setting.

Starting a process runs its code on every worker that probes or samples an environment, so a
registration never gives a command line: it names one the operator lists. Two settings are read
this way: ``TANDEM_MCP_SERVERS`` (MCP tool servers, :mod:`tandem.allowlists.mcp_servers`) and
``TANDEM_AGENT_COMMANDS`` (agent programs, :mod:`tandem.allowlists.agent_commands`), for example
``{"calculator": ["python", "-m", "my_team.mcp_calculator"]}``. The platform refuses a registration
that names any other (a 400 naming the field and the setting), and workers refuse to start it. No
shell runs the command.
"""

from __future__ import annotations

import json
import os
import re

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class NamedCommandRefused(ValueError):
    """The named command is not one the operator lists."""


def configured_named_commands(setting: str, configured: str | None = None) -> dict[str, tuple[str, ...]]:
    """The operator's commands under ``setting``, name to argv, from ``configured`` (default: the
    setting's environment variable).

    Raises:
      ValueError: the setting is not a JSON object of names to non-empty lists of strings.
    """
    if configured is None:
        configured = os.environ.get(setting, "")
    if not configured.strip():
        return {}
    try:
        commands = json.loads(configured)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{setting} is not JSON: {exc}") from None
    if not isinstance(commands, dict):
        raise ValueError(f"{setting} must be a JSON object of name to argv")
    checked = {}
    for name, argv in commands.items():
        if not _NAME.match(name):
            raise ValueError(f"{setting}: {name!r} is not a name of letters, digits, '_', '.', '-'")
        if not isinstance(argv, list) or not argv or not all(isinstance(part, str) and part for part in argv):
            raise ValueError(f"{setting}: {name!r} must be a non-empty list of strings (an argv)")
        checked[name] = tuple(argv)
    return checked


def check_named_command(name: str, *, setting: str, what: str,
                        commands: dict[str, tuple[str, ...]] | None = None,
                        refusal: type[NamedCommandRefused] = NamedCommandRefused) -> tuple[str, ...]:
    """The argv of the operator's command ``name`` under ``setting`` (``what`` it starts, for the message).

    Raises:
      ``refusal``: the operator lists no command of that name; the message names the setting.
    """
    commands = configured_named_commands(setting) if commands is None else commands
    argv = commands.get(name)
    if argv is None:
        listed = ", ".join(sorted(commands)) or "none"
        raise refusal(
            f"{what} {name!r} is not one the operator allows (listed: {listed}); an operator adds it to "
            f"{setting}, a JSON object of name to argv")
    return argv
