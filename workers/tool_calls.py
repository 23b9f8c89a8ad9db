"""Parsing tool calls out of the policy's text.

Tandem's own format is ``name(argument)``: the argument fills the tool's
first required parameter. It is short on purpose: a byte-level nano policy
has to learn to write it from scratch.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workers.environments.base import Tool

_CALL = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\((.*)\)\s*$", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    tool: Tool
    arguments: dict[str, Any]


def parse_tool_call(text: str, tools: Sequence[Tool]) -> ToolCall | None:
    """The call ``text`` makes, or None when it is not a call to a declared tool."""
    match = _CALL.match(text)
    if match is None:
        return None
    by_name = {tool.name: tool for tool in tools}
    tool = by_name.get(match.group(1))
    if tool is None:
        return None
    required = tool.parameters.get("required") or list(tool.parameters.get("properties", {}))
    if not required:
        return ToolCall(tool, {})
    return ToolCall(tool, {required[0]: match.group(2)})
