"""Which agent programs an ``agent`` environment registration may make a worker start.

A registration names one the operator lists in ``TANDEM_AGENT_COMMANDS``, a JSON object of name to
argv (:mod:`tandem.allowlists.named_commands`). A worker runs it once per episode, without a shell,
with an environment of its own: the episode's endpoint and key, its task, ``PATH`` and ``HOME``,
never the worker's variables (its secrets).
"""

from __future__ import annotations

from tandem.allowlists.named_commands import (
    NamedCommandRefused,
    check_named_command,
    configured_named_commands,
)

AGENT_COMMANDS_SETTING = "TANDEM_AGENT_COMMANDS"


class AgentCommandRefused(NamedCommandRefused):
    """The named agent program is not one the operator lists."""


def configured_agent_commands(configured: str | None = None) -> dict[str, tuple[str, ...]]:
    """The operator's agent programs, name to argv."""
    return configured_named_commands(AGENT_COMMANDS_SETTING, configured)


def check_agent_command(name: str, *, commands: dict[str, tuple[str, ...]] | None = None) -> tuple[str, ...]:
    """The argv of the operator's agent program ``name``; raises AgentCommandRefused naming the setting."""
    return check_named_command(name, setting=AGENT_COMMANDS_SETTING, what="agent program", commands=commands,
                               refusal=AgentCommandRefused)
