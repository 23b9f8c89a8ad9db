"""SFT datasets: one row of a JSONL file of conversations, and the pages the trainer reads them in.

A dataset is uploaded as JSONL in the common chat format, one conversation a line::

    {"messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "..."},
                  {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "calc",
                   "arguments": "{\\"expression\\": \\"2+2\\"}"}}]},
                  {"role": "tool", "tool_call_id": "1", "content": "4"},
                  {"role": "assistant", "content": "4"}],
     "metadata": {"source": "..."}}

:func:`parse_dataset_line` reads one line into a :class:`DatasetRow`, or raises
:class:`DatasetRowError` naming the line and the field (``line 17:
messages.2.role: ...``). The platform stores rows as :meth:`DatasetRow.stored`
writes them (tool calls as ``{name, arguments}`` with arguments an object);
the trainer reads them back, page by page (:class:`DatasetRowsPage`), as
:meth:`DatasetRow.demonstration_messages`, and renders them exactly like an
environment's demonstrations.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import pydantic
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tandem.contracts.demonstrations import DemonstrationMessage
from tandem.contracts.json_values import json_value_problem
from tandem.contracts.schema import Record
from tandem.contracts.trajectories import MessageRole, MessageToolCall

#: Messages one conversation may have; a longer one is surely not a conversation.
DATASET_ROW_MAX_MESSAGES = 1000
#: The most rows the trainer asks for in one page.
DATASET_ROWS_PAGE_MAX = 1000
#: Nesting a row's JSON may have (metadata, tool arguments): a conversation needs a few levels, and
#: deeper values would meet the recursion limits of Python's JSON reader and of what reads rows back.
DATASET_ROW_MAX_DEPTH = 32


class DatasetRowError(ValueError):
    """A line of an uploaded dataset that is not a conversation; ``str()`` names its line and field."""

    def __init__(self, *, line: int, field: str, message: str):
        self.line, self.field, self.message = line, field, message
        super().__init__(f"line {line}: {field}: {message}" if field else f"line {line}: {message}")


class DatasetToolCall(BaseModel):
    """A call as chat datasets write it: ``{name, arguments}`` or OpenAI's ``{id?, type?, function: {...}}``.

    ``arguments`` may be an object or a JSON string of one (OpenAI's).
    """

    model_config = ConfigDict(extra="forbid")

    id: str | None = None
    type: str | None = None
    name: str | None = None
    arguments: dict[str, Any] | str | None = None
    function: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_shape(self) -> DatasetToolCall:
        if self.function is not None:
            if self.name is not None or self.arguments is not None:
                raise ValueError("give either 'function' or 'name' and 'arguments', not both")
            unknown = set(self.function) - {"name", "arguments"}
            if unknown:
                raise ValueError(f"function has unknown keys: {', '.join(sorted(unknown))}")
        if not isinstance(self.call_name, str) or not self.call_name:
            raise ValueError("a tool call needs a name ('name' or 'function.name')")
        self.call_arguments  # noqa: B018 - raises on arguments that are not an object
        return self

    @property
    def call_name(self) -> Any:
        return self.function.get("name") if self.function is not None else self.name

    @property
    def call_arguments(self) -> dict[str, Any]:
        raw = self.function.get("arguments") if self.function is not None else self.arguments
        if raw is None:
            return {}
        if isinstance(raw, str):
            try:
                raw = json.loads(raw) if raw.strip() else {}
            except ValueError:
                raise ValueError("arguments is a string that is not JSON") from None
        if not isinstance(raw, dict):
            raise ValueError("arguments must be a JSON object (or a string holding one)")
        return raw


class DatasetMessage(BaseModel):
    """One message of a dataset's conversation."""

    model_config = ConfigDict(extra="forbid")

    role: MessageRole
    content: str | None = Field(None, description="Null only for an assistant message that makes tool calls.")
    tool_calls: list[DatasetToolCall] = Field(default_factory=list)
    tool_call_id: str | None = Field(None, description="On a tool message: the call it answers (kept, not rendered).")
    name: str | None = Field(None, description="On a tool message: the tool's name (kept, not rendered).")

    @model_validator(mode="after")
    def _content_or_calls(self) -> DatasetMessage:
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only an assistant message makes tool calls")
        if self.content is None and not self.tool_calls:
            raise ValueError("content is required (a string), unless an assistant message makes tool calls")
        if "\x00" in (self.content or ""):
            raise ValueError("content holds a NUL character (\\u0000)")
        return self


class DatasetRow(BaseModel):
    """One conversation: its messages (a user message before the first assistant one) and free metadata."""

    model_config = ConfigDict(extra="forbid")

    messages: list[DatasetMessage] = Field(min_length=2, max_length=DATASET_ROW_MAX_MESSAGES)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("messages")
    @classmethod
    def _a_conversation(cls, messages: list[DatasetMessage]) -> list[DatasetMessage]:
        roles = [message.role for message in messages]
        first = next((role for role in roles if role != "system"), None)
        if first != "user":
            raise ValueError("the first message after any system messages must be a user message (the prompt)")
        if "assistant" not in roles:
            raise ValueError("a conversation needs at least one assistant message: that is what SFT trains on")
        system_after = next((index for index, role in enumerate(roles) if role == "system"
                             and index > roles.index("user")), None)
        if system_after is not None:
            raise ValueError(f"message {system_after} is a system message after the conversation started")
        return messages

    def stored(self) -> dict[str, Any]:
        """The row as the platform stores and serves it: calls as ``{name, arguments}``, None left out."""
        messages = []
        for message in self.messages:
            stored: dict[str, Any] = {"role": message.role, "content": message.content or ""}
            if message.tool_calls:
                stored["tool_calls"] = [{"name": call.call_name, "arguments": call.call_arguments}
                                        for call in message.tool_calls]
            for key in ("tool_call_id", "name"):
                if getattr(message, key) is not None:
                    stored[key] = getattr(message, key)
            messages.append(stored)
        return {"messages": messages, "metadata": self.metadata}


def _unstorable_value(data: Any) -> tuple[str, str] | None:
    """``(field, why)`` of the first value of ``data`` that no database stores as it is, else None.

    The walk is :func:`~tandem.contracts.json_values.json_value_problem` (no recursion, any depth).
    """
    problem = json_value_problem(data, max_depth=DATASET_ROW_MAX_DEPTH)
    if problem is None:
        return None
    field = ".".join(problem.path)
    if problem.kind == "depth":
        return field, f"nested deeper than {DATASET_ROW_MAX_DEPTH} levels"
    if problem.kind == "non_finite":
        return field, f"{problem.found} is no number JSON can store (NaN, Infinity, or past 1.8e308)"
    if problem.in_key:
        return ".".join(problem.path[:-1]), f"has a key that is not valid UTF-8 or holds NUL: {problem.path[-1]!a}"
    if problem.kind == "nul":
        return field, "holds a NUL character (\\u0000)"
    return field, f"is not valid UTF-8: a lone surrogate or an invalid byte (\\u{ord(problem.found):04x})"


def parse_dataset_line(text: str, *, line: int) -> DatasetRow:
    """Line ``line`` (1-based) of a JSONL dataset as a row.

    ``text`` is the line decoded with ``errors="surrogateescape"``, so that an
    invalid byte inside a string is named by its field like any other bad value.
    Every string must be valid UTF-8 without NUL and every number finite, so that
    what is stored is what PostgreSQL and SQLite keep, and what pages and the
    trainer read back.

    Raises:
      DatasetRowError: naming the line and the first field that does not fit (``messages.2.role``).
    """
    try:
        data = json.loads(text)
    except RecursionError:
        raise DatasetRowError(line=line, field="", message=(
            f"nested far deeper than the {DATASET_ROW_MAX_DEPTH} levels a row may have")) from None
    except ValueError as error:
        raise DatasetRowError(line=line, field="", message=f"not JSON ({error})") from None
    if not isinstance(data, dict):
        raise DatasetRowError(line=line, field="", message="expected a JSON object with 'messages'")
    unstorable = _unstorable_value(data)
    if unstorable is not None:
        field, why = unstorable
        raise DatasetRowError(line=line, field=field or "row", message=why)
    try:
        return DatasetRow.model_validate(data)
    except pydantic.ValidationError as error:
        detail = error.errors(include_url=False)[0]
        field = ".".join(str(part) for part in detail["loc"]) or "row"
        message = detail["msg"].removeprefix("Value error, ")
        raise DatasetRowError(line=line, field=field, message=message) from None


def stored_row_messages(row: dict[str, Any]) -> list[DemonstrationMessage]:
    """A stored row's messages as :class:`DemonstrationMessage` (system and tool details dropped).

    Leading system messages are joined into the prompt (the first user
    message), as the prompt layouts open an episode with one prompt. An
    assistant's ``content`` is its text without its calls; the trainer writes
    the calls after it in the run's tool-call format.
    """
    system = [message["content"] for message in row["messages"] if message["role"] == "system"]
    rest = [message for message in row["messages"] if message["role"] != "system"]
    messages = []
    for index, message in enumerate(rest):
        content = message["content"]
        if index == 0 and system:
            content = "\n\n".join([*system, content])
        messages.append(DemonstrationMessage(
            role=message["role"], content=content,
            tool_calls=tuple(MessageToolCall(name=call["name"], arguments=call["arguments"])
                             for call in message.get("tool_calls", ())),
        ))
    return messages


class DatasetRowsPage(Record):
    """``GET /api/trainer/runs/<id>/datasets/<name>/versions/<n>/rows/?offset=&limit=``: a page of rows."""

    dataset: str
    version: int
    offset: int = Field(ge=0)
    total: int = Field(ge=0, description="Rows of the version.")
    rows: list[dict[str, Any]] = Field(description="As DatasetRow.stored writes them, in file order.")


# -- the held-out split ------------------------------------------------------------------------
#
# Every dataset version has an evaluation split that SFT never trains on, so that a held-out loss
# measures what a policy learnt, not what it memorised. A version whose rows say their split
# (``metadata.split``: "evaluation", "validation" or "test" held out; anything else trained on)
# keeps its own; otherwise a fixed twentieth of the rows is held out by a hash of each row's
# messages: the same rows in every run and every version that contains them, and two rows with
# the same messages always on the same side. A version of fewer than DATASET_HELD_OUT_MIN_ROWS
# rows that declares no split holds none out: a twentieth of it would be no row or its only ones.

#: ``metadata.split`` values that put a row in the held-out split.
HELD_OUT_SPLIT_NAMES = frozenset({"evaluation", "validation", "test"})
#: Share of rows held out by hash in a version whose rows declare no split.
DATASET_HELD_OUT_FRACTION = 0.05
#: Rows a version needs before any is held out by hash.
DATASET_HELD_OUT_MIN_ROWS = 20


def _declared_split(row: dict[str, Any]) -> str | None:
    metadata = row.get("metadata") or {}
    split = metadata.get("split") if isinstance(metadata, dict) else None
    return split if isinstance(split, str) else None


def _hashed_fraction(row: dict[str, Any]) -> float:
    digest = hashlib.sha256(json.dumps(row["messages"], sort_keys=True).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def dataset_rows_held_out(rows: Sequence[dict[str, Any]]) -> list[bool]:
    """For each stored row of one dataset version (``DatasetRow.stored``), whether it is held out."""
    if any(_declared_split(row) is not None for row in rows):
        return [_declared_split(row) in HELD_OUT_SPLIT_NAMES for row in rows]
    if len(rows) < DATASET_HELD_OUT_MIN_ROWS:
        return [False] * len(rows)
    return [_hashed_fraction(row) < DATASET_HELD_OUT_FRACTION for row in rows]


# -- which environments have demonstrations -------------------------------------------------
#
# The platform never imports an environment, so it knows whether one can demonstrate only
# from what is declared: the built-in classes and the adapters below, or (for an HTTP server
# advertising ``"demonstrations": true`` in its /schema, or any class) what its probe found.
# A run asked to SFT on an environment not known to demonstrate needs a dataset.

#: Built-in environment classes that have ``demonstrations()``.
DEMONSTRATING_ENTRYPOINTS = frozenset({
    "environments.builtin.calculator:CalculatorEnvironment",
    "environments.builtin.guessing_game:GuessingGameEnvironment",
})
#: Adapter kinds whose demonstrations are known whatever the settings: True, or False (none).
KIND_DEMONSTRATIONS: dict[str, bool] = {"reasoning_gym": True, "gymnasium": False, "openenv": False}
#: The probe check that reports whether a version demonstrates (workers/probe.py): passed with
#: demonstrations, passed with a message starting NO_DEMONSTRATIONS_PROBE_MESSAGE (it has none),
#: or failed (its demonstrations are broken, which SFT cannot use either).
DEMONSTRATIONS_PROBE_CHECK = "demonstrations"
NO_DEMONSTRATIONS_PROBE_MESSAGE = "none"


def probe_check_demonstrates(check: dict) -> bool:
    """Whether a probe's ``demonstrations`` check (a ProbeCheck as JSON) found demonstrations."""
    return check.get("status") == "passed" and not str(check.get("message", "")).startswith(
        NO_DEMONSTRATIONS_PROBE_MESSAGE)


def environment_declares_demonstrations(*, kind: str, entrypoint: str) -> bool | None:
    """Whether an environment of ``kind`` at ``entrypoint`` has demonstrations; None: not declared."""
    if kind in KIND_DEMONSTRATIONS:
        return KIND_DEMONSTRATIONS[kind]
    if kind == "python" and entrypoint in DEMONSTRATING_ENTRYPOINTS:
        return True
    return None
