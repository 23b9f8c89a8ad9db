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
- ``llama3``: the whole turn is one JSON object ``{"name": ..., "parameters":
  {...}}`` (Llama 3.1-3.3's JSON tool calling; the ``<|python_tag|>`` before it
  is a special token, gone from the decoded text).

:func:`tool_call_format_of_template` says which one a chat template implies,
:func:`format_tool_call` writes a call the way the model would,
:func:`tool_schemas` turns tools into the function specs templates take, and
:func:`demonstration_messages` turns a :class:`~environments.base.Demonstration`
(written in the ``tandem`` format) into chat messages in a model's own format.

A turn whose tool-call markup is malformed (bad JSON, an unclosed block, arguments that are not
an object), names a tool the environment does not offer, or passes arguments its JSON schema
refuses makes no call: ``parse_tool_calls(...).status`` says which
(:data:`~tandem.contracts.ToolCallStatus`) and ``.error`` why. The agent answers it with a tool
message that says so, and the episode goes on; it is never taken as the answer. Text with no
markup at all (prose, or ``f(x)`` of no declared tool in the ``tandem`` format) is an answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, get_args

import jsonschema

from environments.base import Demonstration, Tool
from tandem.configs.model import ToolCallFormat
from tandem.contracts import ToolCallStatus

_CALL = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\((.*)\)\s*$", re.DOTALL)
_JSON_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_UNCLOSED_BLOCK = re.compile(r"<tool_call>(?!.*</tool_call>)", re.DOTALL)
_XML_FUNCTION = re.compile(r"^<function=([^>\s]+)>(.*)</function>$", re.DOTALL)
_XML_PARAMETER = re.compile(r"<parameter=([^>\s]+)>\n?(.*?)\n?</parameter>", re.DOTALL)

FORMATS: tuple[str, ...] = get_args(ToolCallFormat)


@dataclass(frozen=True)
class ToolCall:
    tool: Tool
    arguments: dict[str, Any]

    @property
    def copies_example(self) -> bool:
        """Its arguments are its tool's example (:func:`example_arguments`), the call the tool instructions show."""
        return self.arguments == example_arguments(self.tool)

    def recorded(self) -> dict[str, Any]:
        """The call as an episode's message records it (``tandem.contracts.MessageToolCall``)."""
        return {"name": self.tool.name, "arguments": self.arguments,
                **({"copies_example": True} if self.copies_example else {})}


@dataclass(frozen=True)
class ToolCallParse:
    """The calls a turn makes (empty: none), and why markup that looked like a call was not one."""

    calls: list[ToolCall] = field(default_factory=list)
    format: str | None = None
    error: str | None = None
    #: None: no tool-call markup (the turn is an answer); ok: ``calls``; else why there are none.
    status: ToolCallStatus | None = None

    @classmethod
    def failed(cls, fmt: str, failure: _Failure) -> ToolCallParse:
        return cls([], fmt, failure.reason, failure.status)


@dataclass(frozen=True)
class _Failure:
    status: ToolCallStatus
    reason: str


def _schema_refusal(tool: Tool, arguments: dict[str, Any], *, typed: bool) -> str | None:
    """Why ``tool``'s JSON schema refuses ``arguments``, or None. ``typed`` false (Qwen3-Coder's XML,
    whose values are all text): only the required parameters are checked."""
    schema = tool.parameters if typed else {"required": tool.parameters.get("required", [])}
    try:
        error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(arguments))
    except jsonschema.exceptions.SchemaError:
        return None  # the tool's own schema is broken: its arguments are its to judge
    if error is None:
        return None
    where = ".".join(str(part) for part in error.absolute_path)
    return f"arguments of {tool.name!r} do not match its schema" + (f" at {where}" if where else "") \
        + f": {error.message}"


def _parse_tandem(text: str, by_name: dict[str, Tool]) -> ToolCallParse | None:
    match = _CALL.match(text)
    if match is None:
        return None
    tool = by_name.get(match.group(1))
    if tool is None:
        return None  # prose like "f(x)" is an answer, not a failed call
    required = tool.parameters.get("required") or list(tool.parameters.get("properties", {}))
    arguments = {required[0]: match.group(2)} if required else {}
    return ToolCallParse([ToolCall(tool, arguments)], "tandem", status="ok")


def _unknown_tool(name: str, by_name: dict[str, Tool]) -> _Failure:
    return _Failure("unknown_tool", f"unknown tool {name!r}; the tools are {', '.join(sorted(by_name))}")


def _decoded(text: str) -> Any | _Failure:
    """The JSON value of a call's text, or why it has none."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        return _Failure("unparsed", f"tool call is not valid JSON: {exc}")


def _json_calls(block: str, by_name: dict[str, Tool]) -> list[ToolCall] | _Failure:
    """The calls of a JSON block: one object, or a list of them (SmolLM2's format, from APIGen's
    function-calling data: ``<tool_call>[{"name": ...}, ...]</tool_call>``); or why it holds none."""
    payload = _decoded(block)
    if isinstance(payload, _Failure):
        return payload
    if not isinstance(payload, list):
        payload = [payload]
    elif not payload:
        return _Failure("unparsed", "tool call is an empty list")
    calls = []
    for item in payload:
        call = _json_call(item, by_name)
        if isinstance(call, _Failure):
            return call
        calls.append(call)
    return calls


def _json_call(payload: Any, by_name: dict[str, Tool]) -> ToolCall | _Failure:
    """The call one decoded JSON value makes, or why it is not one."""
    if not isinstance(payload, dict):
        return _Failure("unparsed", "tool call is not a JSON object")
    name = payload.get("name")
    if not isinstance(name, str):
        return _Failure("unparsed", "tool call has no string 'name'")
    tool = by_name.get(name)
    if tool is None:
        return _unknown_tool(name, by_name)
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):
        # Some templates double-encode the arguments as a JSON string.
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            return _Failure("unparsed", f"arguments of {name!r} are a string that is not JSON: {exc}")
    if not isinstance(arguments, dict):
        return _Failure("unparsed", f"arguments of {name!r} are not a JSON object")
    refusal = _schema_refusal(tool, arguments, typed=True)
    if refusal is not None:
        return _Failure("invalid_arguments", refusal)
    return ToolCall(tool, arguments)


def _xml_call(block: str, by_name: dict[str, Tool]) -> ToolCall | _Failure:
    match = _XML_FUNCTION.match(block)
    if match is None:
        return _Failure("unparsed", "tool call is neither JSON nor <function=...>...</function>")
    tool = by_name.get(match.group(1))
    if tool is None:
        return _unknown_tool(match.group(1), by_name)
    # Parameter values are text, as the template writes them; a tool parses what it needs.
    arguments = dict(_XML_PARAMETER.findall(match.group(2)))
    refusal = _schema_refusal(tool, arguments, typed=False)
    if refusal is not None:
        return _Failure("invalid_arguments", refusal)
    return ToolCall(tool, arguments)


def _parse_blocks(text: str, by_name: dict[str, Tool], *, fmt: str) -> ToolCallParse | None:
    blocks = _JSON_BLOCK.findall(text)
    if not blocks:
        if _UNCLOSED_BLOCK.search(text):
            return ToolCallParse.failed(fmt, _Failure("unparsed", "<tool_call> without </tool_call>"))
        return None
    calls = []
    for block in blocks:
        block = block.strip()
        if fmt == "qwen" and block.startswith("<function="):
            call = _xml_call(block, by_name)
            block_calls = call if isinstance(call, _Failure) else [call]
        else:
            block_calls = _json_calls(block, by_name)
        if isinstance(block_calls, _Failure):
            # One bad block spoils the turn: running only some of the calls would be a guess.
            return ToolCallParse.failed(fmt, block_calls)
        calls.extend(block_calls)
    return ToolCallParse(calls, fmt, status="ok")


def _parse_llama3(text: str, by_name: dict[str, Tool]) -> ToolCallParse | None:
    stripped = text.strip()
    if not (stripped.startswith("{") and '"name"' in stripped):
        return None  # prose, not an attempt at a call
    payload = _decoded(stripped)
    call = payload if isinstance(payload, _Failure) else _json_call(payload, by_name)
    if isinstance(call, _Failure):
        return ToolCallParse.failed("llama3", call)
    return ToolCallParse([call], "llama3", status="ok")


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
        elif fmt == "llama3":
            parsed = _parse_llama3(text, by_name)
        else:
            parsed = _parse_blocks(text, by_name, fmt=fmt)
        if parsed is not None:
            return parsed
    return ToolCallParse()


def text_outside_calls(text: str, parsed: ToolCallParse) -> str:
    """What ``text`` says besides the calls ``parsed`` found in it: the prose around ``<tool_call>``
    blocks; nothing for the formats whose call is the whole turn (``tandem``, ``llama3``); all of it
    when it made no call."""
    if not parsed.calls:
        return text
    if parsed.format in ("tandem", "llama3"):
        return ""
    return _JSON_BLOCK.sub("", text).strip()


def parse_tool_call(text: str, tools: Sequence[Tool], *, formats: Sequence[str] = FORMATS) -> ToolCall | None:
    """The (first) call ``text`` makes, or None when it is not a call to a declared tool."""
    calls = parse_tool_calls(text, tools, formats=formats).calls
    return calls[0] if calls else None


def tool_call_format_of_template(chat_template: str | None) -> ToolCallFormat:
    """The tool-call format a chat template implies; ``tandem`` without a template.

    A template that writes ``<tool_call>`` blocks (Hermes, Qwen) implies
    ``qwen`` (which reads Hermes' JSON blocks too); one with Llama 3's
    ``<|python_tag|>`` or ``ipython`` role implies ``llama3``. A template that
    knows no tools at all gets ``hermes``: the tools and that syntax are then
    described in a system message (:func:`tool_instructions`).
    """
    if chat_template is None:
        return "tandem"
    if "<tool_call>" in chat_template:
        return "qwen"
    if "<|python_tag|>" in chat_template or "ipython" in chat_template:
        return "llama3"
    return "hermes"


def tool_schemas(tools: Sequence[Tool]) -> list[dict[str, Any]]:
    """The tools as the function specs chat templates take (OpenAI's ``{"type": "function", ...}``)."""
    return [
        {"type": "function",
         "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters}}
        for tool in tools
    ]


def example_arguments(tool: Tool) -> dict[str, Any] | None:
    """Arguments of an example call of ``tool``: the first of each required parameter's JSON Schema
    ``examples``; None when a required parameter has none (no example is made up)."""
    properties = tool.parameters.get("properties", {})
    arguments = {}
    for name in tool.parameters.get("required", []):
        examples = properties.get(name, {}).get("examples")
        if not isinstance(examples, list) or not examples:
            return None
        arguments[name] = examples[0]
    return arguments


def tool_instructions(tools: Sequence[Tool]) -> str:
    """A system message describing ``tools`` and the Hermes call syntax, for templates that know no tools.

    It ends with one whole example call, of the first tool whose required parameters declare
    ``examples``: a model that knows no tool format (SmolLM2-135M-Instruct) copies a concrete call far
    more often than it fills in the syntax's placeholders, and GRPO with no demonstrations needs a
    few calls that run to learn from (issue 31, bench/README.md).
    """
    listed = "\n".join(json.dumps(schema, ensure_ascii=False) for schema in tool_schemas(tools))
    text = (
        "You may call these tools, described as JSON schemas:\n<tools>\n" + listed + "\n</tools>\n"
        'To call one, reply with <tool_call>{"name": <tool name>, "arguments": <arguments object>}'
        "</tool_call> and nothing else; its result comes back in the next message."
    )
    for tool in tools:
        arguments = example_arguments(tool)
        if arguments is not None:
            # On one line, as the syntax above it is written.
            call = json.dumps({"name": tool.name, "arguments": arguments}, ensure_ascii=False)
            return text + f"\nFor example: <tool_call>{call}</tool_call>"
    return text


def format_tool_call(name: str, arguments: dict[str, Any], fmt: ToolCallFormat) -> str:
    """The text of a call in ``fmt``, as a model trained on that format writes it."""
    if fmt == "tandem":
        values = list(arguments.values())
        return f"{name}({values[0] if values else ''})"
    if fmt == "llama3":
        return json.dumps({"name": name, "parameters": arguments}, ensure_ascii=False)
    payload = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{payload}\n</tool_call>"


def demonstration_messages(
    demonstration: Demonstration, tools: Sequence[Tool], fmt: ToolCallFormat
) -> list[dict[str, Any]]:
    """A demonstration as chat messages, its tool calls rewritten in ``fmt``.

    Demonstrations are written in the ``tandem`` format (``calc(37*58)``). A
    policy turn that is such a call becomes an assistant message holding the
    call as the model writes it in ``fmt``; the environment turn after a call
    becomes a ``tool`` message, any other environment turn a ``user`` message.
    """
    messages: list[dict[str, Any]] = [{"role": "user", "content": demonstration.prompt}]
    after_call = False
    for turn in demonstration.turns:
        if turn.role == "policy":
            call = _parse_tandem(turn.text, {tool.name: tool for tool in tools}) if tools else None
            if call is not None and call.calls:
                first = call.calls[0]
                messages.append({"role": "assistant", "content": format_tool_call(first.tool.name, first.arguments, fmt),
                                 "tool_calls": [{"name": first.tool.name, "arguments": first.arguments}]})
                after_call = True
            else:
                messages.append({"role": "assistant", "content": turn.text})
                after_call = False
        else:
            messages.append({"role": "tool" if after_call else "user", "content": turn.text})
            after_call = False
    return messages
