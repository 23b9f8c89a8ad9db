"""Parsing tool calls out of the policy's text.

Three formats are understood:

- ``tandem``: ``name(argument)``, the whole turn; the argument fills the
  tool's first required parameter. It is short on purpose: a byte-level nano
  policy has to learn to write it from scratch.
- ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
  blocks (Hermes 2 Pro / 3); text around them (reasoning) is allowed and every
  block in the turn is a call, run in order.
- ``qwen``: the same JSON blocks (Qwen2.5 / Qwen3 templates), plus the XML
  body of Qwen3-Coder: ``<tool_call><function=calc><parameter=expression>
  37*58</parameter></function></tool_call>``.

A turn whose tool-call markup is malformed (bad JSON, unknown tool, arguments
that are not an object) is no call at all: the text goes to ``step`` as an
action, and ``parse_tool_calls(...).error`` says why it was not a call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from environments.base import Tool

_CALL = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\((.*)\)\s*$", re.DOTALL)
_JSON_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_UNCLOSED_BLOCK = re.compile(r"<tool_call>(?!.*</tool_call>)", re.DOTALL)
_XML_FUNCTION = re.compile(r"^<function=([^>\s]+)>(.*)</function>$", re.DOTALL)
_XML_PARAMETER = re.compile(r"<parameter=([^>\s]+)>\n?(.*?)\n?</parameter>", re.DOTALL)

FORMATS = ("tandem", "qwen", "hermes")


@dataclass(frozen=True)
class ToolCall:
    tool: Tool
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolCallParse:
    """The calls a turn makes (empty: none), and why markup that looked like a call was not one."""

    calls: list[ToolCall] = field(default_factory=list)
    format: str | None = None
    error: str | None = None


def _parse_tandem(text: str, by_name: dict[str, Tool]) -> ToolCallParse | None:
    match = _CALL.match(text)
    if match is None:
        return None
    tool = by_name.get(match.group(1))
    if tool is None:
        return None  # prose like "f(x)" is an answer, not a failed call
    required = tool.parameters.get("required") or list(tool.parameters.get("properties", {}))
    arguments = {required[0]: match.group(2)} if required else {}
    return ToolCallParse([ToolCall(tool, arguments)], "tandem")


def _json_call(block: str, by_name: dict[str, Tool]) -> ToolCall | str:
    """A call, or the reason the block is not one."""
    try:
        payload = json.loads(block)
    except json.JSONDecodeError as exc:
        return f"tool call is not valid JSON: {exc}"
    if not isinstance(payload, dict):
        return "tool call is not a JSON object"
    name = payload.get("name")
    if not isinstance(name, str):
        return "tool call has no string 'name'"
    tool = by_name.get(name)
    if tool is None:
        return f"unknown tool {name!r}"
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):
        # Some templates double-encode the arguments as a JSON string.
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            return f"arguments of {name!r} are a string that is not JSON: {exc}"
    if not isinstance(arguments, dict):
        return f"arguments of {name!r} are not a JSON object"
    return ToolCall(tool, arguments)


def _xml_call(block: str, by_name: dict[str, Tool]) -> ToolCall | str:
    match = _XML_FUNCTION.match(block)
    if match is None:
        return "tool call is neither JSON nor <function=...>...</function>"
    tool = by_name.get(match.group(1))
    if tool is None:
        return f"unknown tool {match.group(1)!r}"
    # Parameter values are text, as the template writes them; a tool parses what it needs.
    return ToolCall(tool, dict(_XML_PARAMETER.findall(match.group(2))))


def _parse_blocks(text: str, by_name: dict[str, Tool], *, fmt: str) -> ToolCallParse | None:
    blocks = _JSON_BLOCK.findall(text)
    if not blocks:
        if _UNCLOSED_BLOCK.search(text):
            return ToolCallParse([], fmt, "<tool_call> without </tool_call>")
        return None
    calls = []
    for block in blocks:
        block = block.strip()
        if fmt == "qwen" and block.startswith("<function="):
            call = _xml_call(block, by_name)
        else:
            call = _json_call(block, by_name)
        if isinstance(call, str):
            # One bad block spoils the turn: running only some of the calls would be a guess.
            return ToolCallParse([], fmt, call)
        calls.append(call)
    return ToolCallParse(calls, fmt)


def parse_tool_calls(text: str, tools: Sequence[Tool], *, formats: Sequence[str] = FORMATS) -> ToolCallParse:
    """Every call ``text`` makes to a declared tool, trying ``formats`` in order.

    The first format whose markup appears decides: a malformed ``<tool_call>``
    block is reported, not skipped over for another format.
    """
    unknown = set(formats) - set(FORMATS)
    if unknown:
        raise ValueError(f"unknown tool-call formats {sorted(unknown)}; known: {FORMATS}")
    if not tools:
        return ToolCallParse()
    by_name = {tool.name: tool for tool in tools}
    for fmt in formats:
        if fmt == "tandem":
            parsed = _parse_tandem(text, by_name)
        else:
            parsed = _parse_blocks(text, by_name, fmt=fmt)
        if parsed is not None:
            return parsed
    return ToolCallParse()


def parse_tool_call(text: str, tools: Sequence[Tool], *, formats: Sequence[str] = FORMATS) -> ToolCall | None:
    """The (first) call ``text`` makes, or None when it is not a call to a declared tool."""
    calls = parse_tool_calls(text, tools, formats=formats).calls
    return calls[0] if calls else None
