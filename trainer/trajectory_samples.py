"""A few trajectories of each RL step, made readable and sent to the platform's trajectory browser.

Of the records a step trained on, :func:`select_samples` picks whole groups
(the widest reward ranges first, failed members included) and the step's best
and worst rewards and failed episodes; :func:`trajectory_sample` turns one into
a :class:`~tandem.contracts.TrajectorySample`: the conversation turn by turn,
its tool calls, and the loss mask as spans of decoded text, each token with its
text, behaviour log-probability and advantage while the sample stays small
(:data:`MAX_SAMPLE_BYTES`). :class:`TrajectorySampleBuffer` gathers them and
posts them with the telemetry flushes, in posts the platform accepts; a post
that fails loses those samples and never the step.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from environments import Tool, parse_tool_calls
from policy import Tokenizer
from tandem.contracts import (
    TokenSpan,
    ToolCallSample,
    ToolSchema,
    TrajectoryRecord,
    TrajectorySample,
    TrajectoryTurn,
)
from trainer.platform_client import MAX_TELEMETRY_POST_BYTES

logger = logging.getLogger(__name__)

# Samples held while the platform does not answer; older ones go first.
_MAX_PENDING = 512
# A sample's JSON above this goes without its per-token values (about 40 bytes a token), so a
# long episode costs its text only and a post of a whole group stays far below the platform's
# request limit (MAX_TELEMETRY_POST_BYTES).
MAX_SAMPLE_BYTES = 256 * 2**10
# The platform refuses posts of more samples (platform/trajectories/views.py).
MAX_SAMPLES_PER_POST = 200


def select_samples(
    records: Sequence[TrajectoryRecord], *, per_step: int, groups_per_step: int = 0
) -> list[tuple[str, TrajectoryRecord]]:
    """``(why, record)`` for the records worth showing: whole groups, best and worst rewards, failures.

    First ``groups_per_step`` whole groups (every member, failed ones too, as
    "group"), the widest reward range first (ties by stream order): the groups
    whose advantages told episodes apart. Then ``per_step`` records of the
    successful episodes at most, the higher half of them the best rewards and
    the rest the worst (the best first, ties by stream order), plus up to
    ``per_step`` failed episodes. A record is chosen once.
    """
    chosen: list[tuple[str, TrajectoryRecord]] = []
    seen: set[str] = set()

    def take(why: str, record: TrajectoryRecord) -> None:
        if record.trajectory_id not in seen:
            seen.add(record.trajectory_id)
            chosen.append((why, record))

    for group in _groups_by_reward_range(records)[:max(groups_per_step, 0)]:
        for record in group:
            take("group", record)
    if per_step <= 0:
        return chosen
    finished = [record for record in records if record.status != "failed"]
    by_reward = sorted(finished, key=lambda record: record.reward)  # stable: ties keep stream order
    best_count = (per_step + 1) // 2
    for record in sorted(finished, key=lambda record: -record.reward)[:best_count]:
        take("best", record)
    for record in by_reward[: per_step - best_count]:
        take("worst", record)
    for record in [record for record in records if record.status == "failed"][:per_step]:
        take("failed", record)
    return chosen


def _groups_by_reward_range(records: Sequence[TrajectoryRecord]) -> list[list[TrajectoryRecord]]:
    """The records' groups in stream order, then sorted (stably) by reward range, widest first.

    The range is over the group's finished episodes: a failed one's reward is no outcome.
    """
    groups: dict[str, list[TrajectoryRecord]] = {}
    for record in records:
        groups.setdefault(record.group_id, []).append(record)

    def reward_range(group: list[TrajectoryRecord]) -> float:
        rewards = [record.reward for record in group if record.status != "failed"]
        return max(rewards) - min(rewards) if rewards else 0.0

    return sorted(groups.values(), key=lambda group: -reward_range(group))


def _policy_token_flags(record: TrajectoryRecord) -> list[bool]:
    """Which tokens the policy generated.

    The loss mask says so, except for failed episodes, whose mask producers
    zero (nothing of them is trained); there the behaviour log-probabilities
    still tell the policy's tokens (non-zero) from the rest (0.0). A sampled
    token of probability exactly 1 in a failed episode is then shown as the
    environment's: an accepted imprecision of a view that trains nothing.
    """
    if record.status != "failed":
        return [mask == 1 for mask in record.loss_mask]
    return [logprob != 0.0 for logprob in record.behaviour_logprobs]


def _turn_bounds(record: TrajectoryRecord, eos_id: int) -> list[tuple[int, int, bool]]:
    """``(start, end, is_policy)`` of each turn: maximal runs, a policy turn also ending after EOS."""
    flags = _policy_token_flags(record)
    bounds: list[tuple[int, int, bool]] = []
    start = 0
    for index in range(1, len(flags) + 1):
        at_end = index == len(flags)
        closes_policy_turn = flags[index - 1] and record.token_ids[index - 1] == eos_id
        if at_end or flags[index] != flags[index - 1] or closes_policy_turn:
            bounds.append((start, index, flags[index - 1]))
            start = index
    return bounds


def _decode(tokenizer: Tokenizer, token_ids: Sequence[int]) -> str:
    """Text of the tokens, special ones written out, so an EOS the loss trains on can be seen.

    A Hugging Face tokenizer writes its special tokens as themselves (``<|im_end|>``);
    the byte tokenizer's have no text, so they are named (⟨bos⟩, ⟨eos⟩, ⟨pad⟩).
    """
    if hasattr(tokenizer, "decode_with_specials"):
        return tokenizer.decode_with_specials(list(token_ids))
    # Later entries win: a tokenizer that pads with its EOS (HFTokenizer's fallback) shows ⟨eos⟩.
    names = {tokenizer.pad_id: "⟨pad⟩", tokenizer.eos_id: "⟨eos⟩"}
    if tokenizer.bos_id is not None:
        names[tokenizer.bos_id] = "⟨bos⟩"
    parts, ordinary = [], []
    for token_id in token_ids:
        if token_id in names:
            if ordinary:
                parts.append(tokenizer.decode(ordinary))
                ordinary = []
            parts.append(names[token_id])
        else:
            ordinary.append(token_id)
    if ordinary:
        parts.append(tokenizer.decode(ordinary))
    return "".join(parts)


@dataclass(frozen=True)
class _TokenValues:
    """The record's per-token values, sliced with its tokens; ``advantage`` None: none to show."""

    logprobs: Sequence[float]
    advantage: float | None


def _spans(tokenizer: Tokenizer, token_ids: Sequence[int], loss_mask: Sequence[int],
           values: _TokenValues | None = None, offset: int = 0) -> tuple[TokenSpan, ...]:
    """``token_ids`` (from ``offset`` of the record) as runs of the loss mask, with per-token values."""
    spans, start = [], 0
    for index in range(1, len(token_ids) + 1):
        if index == len(token_ids) or loss_mask[index] != loss_mask[start]:
            trained = loss_mask[start] == 1
            per_token = {}
            if values is not None:
                per_token = {
                    "pieces": tuple(_decode(tokenizer, [token_id]) for token_id in token_ids[start:index]),
                    "logprobs": tuple(float(logprob) for logprob
                                      in values.logprobs[offset + start:offset + index]),
                }
                if values.advantage is not None:
                    # The loss weighs masked tokens by nothing: their advantage is 0 in the update.
                    per_token["advantages"] = (values.advantage if trained else 0.0,) * (index - start)
            spans.append(TokenSpan(text=_decode(tokenizer, token_ids[start:index]), tokens=index - start,
                                   trained=trained, **per_token))
            start = index
    return tuple(spans)


def trajectory_sample(
    record: TrajectoryRecord, *, step: int, selected_because: str, tokenizer: Tokenizer,
    tools: Sequence[ToolSchema] = (), purpose: str = "training", advantage: float | None = None,
    max_bytes: int = MAX_SAMPLE_BYTES,
) -> TrajectorySample:
    """``record`` as people read it; ``tools`` are the environment's, to recognise tool calls.

    ``advantage``: the episode's in the update that trained it (None: not trained, or per token).
    Its spans carry per-token values unless the sample's JSON would pass ``max_bytes``; then
    they are left out and ``token_values`` says so.
    """
    sample = _sample(record, step=step, selected_because=selected_because, tokenizer=tokenizer, tools=tools,
                     purpose=purpose, advantage=advantage,
                     values=_TokenValues(logprobs=record.behaviour_logprobs, advantage=advantage))
    if len(sample.model_dump_json()) > max_bytes:
        sample = _sample(record, step=step, selected_because=selected_because, tokenizer=tokenizer, tools=tools,
                         purpose=purpose, advantage=advantage, values=None)
    return sample


def _sample(record: TrajectoryRecord, *, step: int, selected_because: str, tokenizer: Tokenizer,
            tools: Sequence[ToolSchema], purpose: str, advantage: float | None,
            values: _TokenValues | None) -> TrajectorySample:
    if record.messages:
        turns = tuple(_message_turns(record, tokenizer, values))
    else:
        turns = tuple(_token_turns(record, tokenizer, tools, values))
    return TrajectorySample(
        trajectory_id=record.trajectory_id, run_id=record.run_id, step=step, purpose=purpose,
        selected_because=selected_because, group_id=record.group_id, group_size=record.group_size,
        advantage=advantage, token_values="included" if values is not None else "left_out_for_size",
        environment=record.environment,
        reward=record.reward, status=record.status, failure_reason=record.failure_reason,
        policy_version=record.policy_version, policy_versions=list(record.policy_versions),
        num_tokens=len(record.token_ids), trained_tokens=sum(1 for mask in record.loss_mask if mask == 1),
        started_at=record.timings.started_at, finished_at=record.timings.finished_at, turns=turns,
        by_message=bool(record.messages),
    )


def _message_turns(record: TrajectoryRecord, tokenizer: Tokenizer,
                   values: _TokenValues | None) -> list[TrajectoryTurn]:
    """One turn per message the producer recorded; each holds its tokens up to the next message's.

    The template's markup goes with the message it opens (an assistant turn starts at its
    generation prompt), so the spans show what was masked around the model's own tokens.
    """
    messages = sorted(record.messages, key=lambda message: message.start)
    segment_starts = set(record.segment_starts)
    turns, policy_turns = [], 0
    for index, message in enumerate(messages):
        start = 0 if index == 0 else message.start
        end = messages[index + 1].start if index + 1 < len(messages) else len(record.token_ids)
        spans = _spans(tokenizer, record.token_ids[start:end], record.loss_mask[start:end], values, start)
        if message.role == "assistant" and not message.replayed:
            versions, calls = record.policy_versions, record.agent_calls
            turns.append(TrajectoryTurn(
                role="policy", text=message.content, spans=spans,
                policy_version=versions[policy_turns] if policy_turns < len(versions) else None,
                tool_calls=message.tool_calls, tool_call_status=message.tool_call_status,
                tool_call_error=message.tool_call_error,
                agent_call=calls[policy_turns] if policy_turns < len(calls) else None,
            ))
            policy_turns += 1
        elif message.role == "assistant":
            # An answer an agent gave back as history in a later chain: part of that chain's prompt.
            turns.append(TrajectoryTurn(role="prompt", text=message.content, spans=spans))
        else:
            role = {"system": "prompt", "tool": "tool"}.get(message.role)
            if role is None:  # a user message: the prompt (of the episode or of a segment), or a step's observation
                role = "environment" if policy_turns and message.start not in segment_starts else "prompt"
            turns.append(TrajectoryTurn(role=role, text=message.content, spans=spans))
    return turns


def _token_turns(record: TrajectoryRecord, tokenizer: Tokenizer, tools: Sequence[ToolSchema],
                 values: _TokenValues | None) -> list[TrajectoryTurn]:
    """Turns told apart by the loss mask and EOS: records from before producers kept messages."""
    callable_tools = [Tool(name=tool.name, description=tool.description, parameters=tool.parameters, run=None)
                      for tool in tools]
    turns: list[TrajectoryTurn] = []
    policy_turns = 0
    last_policy_called_tools = False
    for start, end, is_policy in _turn_bounds(record, tokenizer.eos_id):
        token_ids = record.token_ids[start:end]
        text = tokenizer.decode(token_ids)
        spans = _spans(tokenizer, token_ids, record.loss_mask[start:end], values, start)
        if is_policy:
            calls = parse_tool_calls(text, callable_tools).calls
            versions = record.policy_versions
            turns.append(TrajectoryTurn(
                role="policy", text=text, spans=spans,
                policy_version=versions[policy_turns] if policy_turns < len(versions) else None,
                tool_calls=tuple(ToolCallSample(name=call.tool.name, arguments=call.arguments) for call in calls),
            ))
            policy_turns += 1
            last_policy_called_tools = bool(calls)
        else:
            role = "prompt" if not turns else "tool" if last_policy_called_tools else "environment"
            turns.append(TrajectoryTurn(role=role, text=text, spans=spans))
    return turns


def sample_posts(samples: Sequence[TrajectorySample], *, max_bytes: int = MAX_TELEMETRY_POST_BYTES,
                 max_samples: int = MAX_SAMPLES_PER_POST) -> tuple[list[list[TrajectorySample]], int]:
    """``samples`` split into posts of at most ``max_bytes`` of JSON and ``max_samples`` each, in order.

    A sample too large for a post on its own is left out; returns the posts and how many were.
    """
    posts: list[list[TrajectorySample]] = []
    size, left_out = 0, 0
    for sample in samples:
        # As json.dumps writes it by default (spaces, non-ASCII escaped): at least as long as the
        # client's encoding of it, in characters and in bytes.
        length = len(json.dumps(sample.model_dump(mode="json"))) + 2  # and the ", " after it
        if length + 64 > max_bytes:  # 64: the {"samples": [...]} around them
            left_out += 1
            continue
        if not posts or size + length + 64 > max_bytes or len(posts[-1]) >= max_samples:
            posts.append([])
            size = 0
        posts[-1].append(sample)
        size += length
    return posts, left_out


@dataclass
class TrajectorySampleBuffer:
    """Samples of the steps since the last flush; ``flush`` posts them, dropping them if that fails.

    ``groups_per_step`` whole groups and ``per_step`` best and worst episodes (and as many failed
    ones) of each step: :func:`select_samples`.
    """

    platform: object  # trainer.platform_client.PlatformClient
    run_id: int
    tokenizer: Tokenizer
    per_step: int
    groups_per_step: int = 0
    tools: Sequence[ToolSchema] = ()
    pending: list[TrajectorySample] = field(default_factory=list)
    posted: int = 0
    lost: int = 0

    def add_step(self, *, step: int, records: Sequence[TrajectoryRecord], purpose: str = "training",
                 tools: Sequence[ToolSchema] | None = None,
                 advantages: Mapping[str, float] | None = None) -> None:
        """Sample ``records``: a trained step's, or (``purpose`` evaluation) an evaluation's of ``step``;
        ``tools``: those of the environment they ran in, when it is not the run's own; ``advantages``:
        by trajectory id, the per-episode advantages of the records the update trained on."""
        advantages = advantages or {}
        for why, record in select_samples(records, per_step=self.per_step, groups_per_step=self.groups_per_step):
            try:
                self.pending.append(trajectory_sample(record, step=step, selected_because=why,
                                                      tokenizer=self.tokenizer,
                                                      tools=self.tools if tools is None else tools,
                                                      purpose=purpose,
                                                      advantage=advantages.get(record.trajectory_id)))
            except Exception:  # noqa: BLE001 - a view of the data must never stop training on it
                logger.exception("run %s: trajectory %s could not be sampled", self.run_id,
                                 record.trajectory_id)
        if len(self.pending) > _MAX_PENDING:
            self.lost += len(self.pending) - _MAX_PENDING
            self.pending = self.pending[-_MAX_PENDING:]

    def flush(self) -> None:
        if not self.pending:
            return
        samples, self.pending = self.pending, []
        posts, too_large = sample_posts(samples)
        if too_large:
            self.lost += too_large
            logger.warning("run %s: %d trajectory samples too large to post", self.run_id, too_large)
        for post in posts:
            try:
                self.platform.post_trajectory_samples(self.run_id, post)
            except Exception as exc:  # noqa: BLE001 - the browser misses them; training goes on
                self.lost += len(post)
                logger.warning("run %s: %d trajectory samples not posted: %s", self.run_id, len(post), exc)
            else:
                self.posted += len(post)
