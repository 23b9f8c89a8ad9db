"""Finished episodes as producers append them to a run's trajectory stream."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tandem.contracts.schema import SCHEMA_VERSION, Record, SchemaVersionError

#: What became of an episode on the producer's side. ok: the environment ended it;
#: truncated: it was cut off (max_turns, or max_seq_len left no room for another turn or an
#: observation), trained with the reward so far; failed: nothing of it is trained.
EpisodeStatus = Literal["ok", "truncated", "failed"]
EPISODE_STATUSES: tuple[str, ...] = get_args(EpisodeStatus)


def episode_status_choices() -> list[tuple[str, str]]:
    """``(value, label)`` of every episode status: the platform's choices. A callable, so that
    migrations refer to it (``tandem.contracts.trajectories.episode_status_choices``) and a new
    status needs no migration."""
    return [(status, "OK" if status == "ok" else status.capitalize()) for status in EPISODE_STATUSES]

#: Who speaks in a message of an episode's conversation.
MessageRole = Literal["system", "user", "assistant", "tool"]

#: What became of an assistant turn's tool-call markup. ok: every call parsed, named a declared tool
#: with arguments its schema accepts, and ran; unparsed: markup that is no well-formed call (bad JSON,
#: an unclosed block, arguments that are no object); unknown_tool: a call of a tool the environment does
#: not offer; invalid_arguments: arguments the tool's JSON schema refuses; tool_error: the calls parsed
#: and ran, and a tool refused one (``environments.ToolError``). None of these is ever the episode's
#: answer: a tool message says what was wrong, and the episode goes on.
ToolCallStatus = Literal["ok", "unparsed", "unknown_tool", "invalid_arguments", "tool_error"]
TOOL_CALL_STATUSES: tuple[str, ...] = get_args(ToolCallStatus)


class MessageToolCall(BaseModel):
    """A tool call an assistant message made, as the producer parsed it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    arguments: dict = Field(default_factory=dict)
    copies_example: bool = Field(
        False, description="Its arguments are the example its tool's schema declares (the example call the tool "
        "instructions show): it copies the format, not the task, and earns less of a tool-call bonus.")


def tool_call_outcomes_of(turns: Iterable) -> list[str]:
    """The :data:`ToolCallStatus` of each of ``turns`` (conversation messages, or a sample's turns: anything
    with ``tool_call_status``) that wrote tool-call markup, in order."""
    return [turn.tool_call_status for turn in turns if turn.tool_call_status is not None]


def _calls_run_in(turns: Iterable) -> Iterator[MessageToolCall]:
    """The calls that parsed and ran over ``turns`` (anything with ``tool_calls`` and ``tool_call_status``): every
    call they record, but those of a turn whose tool refused one (markup that made no call records none;
    older records' calls all ran) and those of an answer given back as history (``replayed``), counted where
    it was sampled."""
    for turn in turns:
        if turn.tool_call_status != "tool_error" and not getattr(turn, "replayed", False):
            yield from turn.tool_calls


def tool_calls_run_in(turns: Iterable) -> int:
    """How many calls parsed and ran over ``turns`` (:func:`_calls_run_in`)."""
    return sum(1 for _ in _calls_run_in(turns))


def example_copies_run_in(turns: Iterable) -> int:
    """How many of the calls that ran over ``turns`` copied their tool's example (``MessageToolCall.copies_example``)."""
    return sum(call.copies_example for call in _calls_run_in(turns))


class ConversationMessage(BaseModel):
    """One message of an episode as people read it, with the tokens that carry it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: MessageRole
    content: str = Field(description="The message's text (an assistant's as decoded, without special tokens).")
    start: int = Field(ge=0, description="Index of its first token; an assistant message starts at its "
                                         "generation prompt, other messages at the template's markup before them.")
    end: int = Field(ge=0, description="One past its last token.")
    tool_calls: tuple[MessageToolCall, ...] = Field((), description="Calls it made (assistant messages).")
    tool_call_status: ToolCallStatus | None = Field(
        None, description="An assistant message with tool-call markup: what became of it. None: no markup "
        "(an answer), or a record from before this field.")
    tool_call_error: str = Field("", description="Why its tool-call markup was no call (the tool message "
                                                 "that followed told the model the same).")
    replayed: bool = Field(False, description="An assistant message an agent program gave back as history in a "
                                              "later chain (workers/agent_endpoint.py): context, never trained there.")


class AgentCall(BaseModel):
    """One call an agent program made to its episode's OpenAI-compatible endpoint (workers/agent_endpoint.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    chain: int = Field(ge=0, description="Which prefix-consistent chain (the record's segment) the call extended "
                                         "or began: a new one each time the agent rewrote its history.")
    prompt_tokens: int = Field(ge=0, description="Tokens of the prompt the policy was given.")
    completion_tokens: int = Field(ge=0, description="Tokens the policy sampled.")
    latency_s: float = Field(ge=0.0, description="Seconds from the request to the answer.")
    content: str = Field(description="The reply as decoded (its tool-call markup included).")
    tool_calls: tuple[MessageToolCall, ...] = Field((), description="Calls the reply made, as returned.")
    finish_reason: Literal["stop", "tool_calls", "length"] = "stop"
    overrides: tuple[str, ...] = Field(
        (), description="What the request asked that the run overrode (temperature, top_p, max_tokens, "
        "tool_choice), each as `field: asked -> used`.")
    streamed: bool = False


class EpisodeTimings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    started_at: float = Field(description="Unix time the episode started.")
    finished_at: float = Field(description="Unix time the episode ended.")
    generation_s: float = Field(description="Seconds spent waiting for the policy to generate.")
    environment_s: float = Field(description="Seconds spent waiting on environment reset/step (tool calls excluded).")
    tool_s: float = Field(0.0, description="Seconds spent waiting on the environment's tool calls.")
    slot_wait_s: float = Field(
        0.0, ge=0.0, description="Seconds the episode waited, before started_at, for a slot of its "
        "environment's max_concurrent_episodes; 0 when it has no limit."
    )


class TrajectoryRecord(Record):
    """One finished episode, as appended to :func:`trajectory_stream`.

    ``token_ids`` is the whole conversation; ``loss_mask`` is 1 exactly on the
    tokens the policy generated and 0 on prompt, environment and tool tokens.
    ``behaviour_logprobs`` holds the sampling policy's log-probability of each
    token (0.0 where the mask is 0).
    """

    trajectory_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    run_id: int
    group_id: str = Field(description="Episodes of one group share a task; GRPO compares them.")
    group_size: int = Field(description="How many episodes the group has in total.")
    environment: str
    producer: str = Field(
        "", description="`hostname:pid` of the producer process that ran the episode; empty in records "
        "from before this field.",
    )
    policy_version: int = Field(
        description="Oldest policy version that generated any of its tokens; staleness is measured from it."
    )
    policy_versions: list[int] = Field(
        default_factory=list,
        description="Policy version of each policy turn's first token, in order; weights may change between turns.",
    )
    newest_policy_version: int | None = Field(
        None,
        description="Version of the newest weights that generated any of its tokens: newer than "
        "max(policy_versions) when weights changed within a turn (between decode chunks). "
        "None in records from before this field: read as max(policy_versions).",
    )
    token_ids: list[int]
    behaviour_logprobs: list[float]
    loss_mask: list[int]
    reward: float
    status: EpisodeStatus = "ok"
    failure_reason: str = Field("", description="Why it failed or was truncated; empty when ok.")
    num_turns: int = 0
    timings: EpisodeTimings
    messages: tuple[ConversationMessage, ...] = Field(
        (), description="The conversation message by message, in token order; empty in older records."
    )
    segment_starts: tuple[int, ...] = Field(
        (0,),
        description="Token indices where a new context starts (model.past_reasoning: drop re-renders the "
        "conversation without past reasoning); training attends within a segment only.",
    )
    offered_tools: tuple[str, ...] | None = Field(
        None, description="Names of the tools the environment offered the policy. None in records from "
        "before this field: unknown.")
    agent_calls: tuple[AgentCall, ...] = Field(
        (), description="An agent program's episode: each call to its endpoint, in order; empty for episodes "
        "Tandem's own agent loop ran.")

    def tool_call_outcomes(self) -> list[str]:
        """The :data:`ToolCallStatus` of each assistant turn that wrote tool-call markup, in order."""
        return tool_call_outcomes_of(self.messages)

    def tool_calls_run(self) -> int:
        """Calls of its tools that parsed and ran (:func:`tool_calls_run_in`)."""
        return tool_calls_run_in(self.messages)

    def example_copies_run(self) -> int:
        """Of the calls that ran, those that copied their tool's example (:func:`example_copies_run_in`)."""
        return example_copies_run_in(self.messages)

    @model_validator(mode="after")
    def _aligned(self):
        n = len(self.token_ids)
        if len(self.behaviour_logprobs) != n or len(self.loss_mask) != n:
            raise ValueError(
                "token_ids, behaviour_logprobs and loss_mask must have the same length "
                f"(got {n}, {len(self.behaviour_logprobs)}, {len(self.loss_mask)})"
            )
        starts = self.segment_starts
        if not starts or starts[0] != 0 or list(starts) != sorted(set(starts)) or (n and starts[-1] >= n):
            raise ValueError(f"segment_starts must rise strictly from 0 within the tokens; got {list(starts)}")
        return self

    def newest_version(self) -> int:
        """The newest policy version that generated any of its tokens."""
        if self.newest_policy_version is not None:
            return self.newest_policy_version
        return max(self.policy_versions, default=self.policy_version)

    def to_stream_fields(self) -> dict[str, str]:
        return {"schema_version": str(self.schema_version), "payload": self.model_dump_json()}

    @classmethod
    def from_stream_fields(cls, fields: dict) -> TrajectoryRecord:
        decoded = {
            (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in fields.items()
        }
        if int(decoded.get("schema_version", -1)) != SCHEMA_VERSION:
            raise SchemaVersionError(
                f"trajectory schema_version {decoded.get('schema_version')} is not supported"
            )
        return cls.model_validate_json(decoded["payload"])
