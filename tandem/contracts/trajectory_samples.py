"""Trajectories the trainer trained on, decoded for people to read; posted to the platform."""

from __future__ import annotations

from typing import ClassVar, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tandem.contracts.schema import Record
from tandem.contracts.trajectories import (
    AgentCall,
    EpisodeStatus,
    MessageToolCall,
    ToolCallStatus,
    tool_call_outcomes_of,
    tool_calls_run_in,
)

TurnRole = Literal["prompt", "policy", "environment", "tool"]
#: What a sampled episode was for: a trained step's, or a held-out evaluation's (never trained on).
SamplePurpose = Literal["training", "evaluation"]
SAMPLE_PURPOSES: tuple[str, ...] = get_args(SamplePurpose)


def sample_purpose_choices() -> list[tuple[str, str]]:
    """``(value, label)`` of every sample purpose: the platform's choices, referred to by migrations."""
    return [(purpose, purpose.capitalize()) for purpose in SAMPLE_PURPOSES]


#: Schema 2 added whole sampled groups (``selected_because`` "group", ``group_size``, ``advantage``)
#: and per-token values on spans (``pieces``, ``logprobs``, ``advantages``, ``token_values``).
TRAJECTORY_SAMPLE_SCHEMA_VERSION = 2
#: Whether a sample's spans carry per-token values. ``not_recorded``: a sample stored before
#: schema 2; ``left_out_for_size``: the trainer dropped them to keep its posts bounded.
TokenValues = Literal["included", "left_out_for_size", "not_recorded"]
SelectedBecause = Literal["best", "worst", "failed", "group"]


class TokenSpan(BaseModel):
    """A run of consecutive tokens of a turn that the loss either trained on or masked out.

    ``pieces``, ``logprobs`` and ``advantages`` are per token of the span, all empty when the
    sample's ``token_values`` is not ``included``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str = Field(description="The tokens decoded, special tokens included: as their own text "
                      "(<|im_end|>), or for the byte tokenizer as ⟨bos⟩, ⟨eos⟩, ⟨pad⟩.")
    tokens: int = Field(ge=1, description="How many tokens the span has.")
    trained: bool = Field(description="True: the loss mask is 1 on every token of it (policy tokens).")
    pieces: tuple[str, ...] = Field((), description="Each token decoded on its own (a piece of a multi-byte "
                                    "character may be �); empty when per-token values were not sent.")
    logprobs: tuple[float, ...] = Field((), description="Each token's behaviour log-probability (the "
                                        "sampling policy's); 0.0 for tokens the policy did not generate.")
    advantages: tuple[float, ...] = Field((), description="Each token's advantage in the update that trained "
                                          "it (GRPO's: the episode's, on every trained token); 0.0 on masked "
                                          "tokens; empty when unknown (GAE's are per token, computed on device).")

    @model_validator(mode="after")
    def _per_token_values_match_the_tokens(self):
        for name in ("pieces", "logprobs", "advantages"):
            values = getattr(self, name)
            if values and len(values) != self.tokens:
                raise ValueError(f"{name} has {len(values)} values for {self.tokens} tokens")
        return self


#: A tool call a policy turn made, as the producer parsed it.
ToolCallSample = MessageToolCall


class TrajectoryTurn(BaseModel):
    """One turn of a sampled conversation, with its tokens' loss mask as spans."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: TurnRole = Field(
        description="prompt: the reset's observation (and tool header); policy: generated; "
        "tool: the results of the previous policy turn's tool calls; environment: a step's observation."
    )
    text: str
    spans: tuple[TokenSpan, ...] = Field(description="The turn's tokens, run-length encoded by the loss mask.")
    policy_version: int | None = Field(None, description="Policy version that generated it (policy turns).")
    tool_calls: tuple[ToolCallSample, ...] = Field((), description="Calls the turn made (policy turns).")
    tool_call_status: ToolCallStatus | None = Field(
        None, description="A policy turn that wrote tool-call markup: what came of it (ok, unparsed, unknown_tool, "
        "invalid_arguments, tool_error); None: it wrote none, or the record predates the status.")
    tool_call_error: str = Field("", description="Why its markup made no call that ran, as the tool message said.")
    agent_call: AgentCall | None = Field(
        None, description="A policy turn an agent program asked for: its call to the episode's endpoint (chain, "
        "tokens, latency, finish reason, overrides); None for turns of Tandem's own agent loop.")


class TrajectorySample(Record):
    """A trajectory the trainer trained on in ``step``, readable by people; posted to the platform.

    Built from a :class:`TrajectoryRecord` and the run's tokenizer by
    ``trainer.trajectory_samples``. ``turns`` cover every token of the record in order.
    """

    trajectory_id: str
    run_id: int
    step: int = Field(description="The trainer step whose update used it; for an evaluation's, the step of "
                                  "the version it evaluated.")
    purpose: SamplePurpose = Field("training", description="training: a step trained on it; evaluation: a "
                                   "held-out evaluation's episode, never trained on.")
    schema_version: int = TRAJECTORY_SAMPLE_SCHEMA_VERSION
    readable_schema_versions: ClassVar[frozenset[int]] = frozenset({1, TRAJECTORY_SAMPLE_SCHEMA_VERSION})

    selected_because: SelectedBecause = Field(
        description="Why the trainer sent it: the step's best or worst reward, a failed episode, or "
        "a member of a whole group it sampled."
    )
    group_id: str
    group_size: int | None = Field(None, ge=1, description="Episodes of its group; None before schema 2.")
    advantage: float | None = Field(
        None, description="Its advantage in the update that trained it, when the algorithm's is per episode "
        "(GRPO, Dr. GRPO, RLOO). None: not trained on (failed, dropped by dynamic sampling, an evaluation's) "
        "or per token (GAE)."
    )
    token_values: TokenValues = Field(
        "included", description="Whether the spans carry per-token pieces, log-probabilities and advantages."
    )
    environment: str
    reward: float
    status: EpisodeStatus
    failure_reason: str = ""
    policy_version: int = Field(description="Oldest policy version of any of its turns.")
    policy_versions: list[int] = Field(default_factory=list, description="Per policy turn, in order.")
    num_tokens: int = Field(ge=0)
    trained_tokens: int = Field(ge=0, description="Tokens the loss mask trains on.")
    started_at: float
    finished_at: float
    turns: tuple[TrajectoryTurn, ...]
    by_message: bool = Field(
        False, description="True: turns are the producer's messages (their text without the template's "
        "markup, which their spans keep); False: turns told apart by the loss mask (older records)."
    )

    def tool_calls_run(self) -> int:
        """Calls that parsed and ran, as :meth:`TrajectoryRecord.tool_calls_run` counts them."""
        return tool_calls_run_in(self.turns)

    def tool_call_outcomes(self) -> list[str]:
        """The status of each policy turn that wrote tool-call markup, in order."""
        return tool_call_outcomes_of(self.turns)

    @model_validator(mode="before")
    @classmethod
    def _upgrade_schema_1(cls, data):
        """A sample stored before schema 2 has no per-token values: it is read as such."""
        if isinstance(data, dict) and data.get("schema_version") == 1:
            data = {**data, "schema_version": TRAJECTORY_SAMPLE_SCHEMA_VERSION,
                    "token_values": "not_recorded"}
        return data

    @model_validator(mode="after")
    def _spans_cover_the_tokens(self):
        covered = sum(span.tokens for turn in self.turns for span in turn.spans)
        trained = sum(span.tokens for turn in self.turns for span in turn.spans if span.trained)
        if covered != self.num_tokens or trained != self.trained_tokens:
            raise ValueError(
                f"turns' spans cover {covered} tokens ({trained} trained); "
                f"num_tokens is {self.num_tokens} ({self.trained_tokens} trained)"
            )
        return self
