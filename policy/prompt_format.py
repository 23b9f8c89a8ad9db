"""How an episode's messages become the tokens the model is given, turn by turn (token in, token out).

A live episode grows by appending: the prompt, then each sampled turn's
tokens exactly as sampled, then the tokens of whatever the environment or its
tools said, then the next generation prompt. Nothing is ever re-tokenized, so
the trained sequence is exactly what the model was given and what it sampled,
and the loss mask is 1 on sampled tokens only (and on a demonstration's
assistant text, which stands for sampled tokens).

Two layouts, chosen by ``model.prompt_format`` (:func:`prompt_layout`):

- :class:`ChatTemplateLayout`: the tokenizer's own chat template. The prompt
  is rendered with ``add_generation_prompt``; the tokens of new messages are
  the template's text for them after an assistant turn, found by rendering a
  fixed stand-in conversation with and without them, so a template that
  rewrites history (Qwen3 drops earlier ``<think>`` blocks) never changes the
  tokens already appended: the appended tokens win. A sampled turn ends with
  the template's end-of-turn token; one cut off at ``max_new_tokens`` gets it
  appended, masked. Tools reach the template as JSON schemas; a template that
  knows no tools gets them in a system message with the Hermes call syntax.
- :class:`ByteLayout`: the layout nano models trained from scratch learn
  (:mod:`policy.byte_layout`): BOS, ``tools:...`` and the messages' text back
  to back, each assistant turn closed by EOS.

With ``model.past_reasoning: drop`` a chat-template episode whose past turn
held reasoning continues in a new *segment*: its context is re-rendered by the
template without the reasoning, as reasoning models were trained, and its
tokens are appended after the previous segment. Training attends within each
segment only (``segment_ids``), so each turn is trained on exactly the context
it was sampled in.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from environments import (
    Tool,
    ToolCallFormat,
    tool_call_format_of_template,
    tool_instructions,
    tool_schemas,
)
from policy.byte_layout import demonstrated_tokens, opening_tokens
from policy.chat_template import ChatTemplateError, render_text
from policy.tokenizer import HFTokenizer, Tokenizer
from tandem.configs.model import ModelConfig, PastReasoning

Message = dict[str, Any]

# Stand-ins for the content of the fixed conversation new messages are rendered after;
# private-use characters, so no real text collides with them.
_USER_STAND_IN, _ASSISTANT_STAND_IN = "\ue010", "\ue011"
_REASONING = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


class PromptFormatError(ValueError):
    """A conversation the model's prompt format cannot render; the message says why."""


@dataclass
class EpisodeTokens:
    """An episode as the model sees it: tokens, loss mask, behaviour log-probs, and its messages.

    ``messages`` are the conversation as people read it: each has ``role``,
    ``content``, the ``[start, end)`` of its tokens (the template's markup
    around it included; an assistant message starts at its generation prompt)
    and, for assistant turns that called tools, ``tool_calls``.
    ``segment_starts`` are the token indices where a new context begins
    (always 0 first): more than one only with ``past_reasoning: drop``.
    """

    tools: tuple[Tool, ...]
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    behaviour_logprobs: list[float] = field(default_factory=list)
    messages: list[Message] = field(default_factory=list)
    segment_starts: list[int] = field(default_factory=lambda: [0])
    # Where the pending generation prompt begins: the next assistant message starts there.
    _turn_start: int = 0

    def __len__(self) -> int:
        return len(self.token_ids)

    def context(self) -> list[int]:
        """The token ids the next turn is sampled from (the current segment)."""
        return self.token_ids[self.segment_starts[-1]:]

    def _extend(self, token_ids: Sequence[int], *, mask: int, logprobs: Sequence[float] | None = None) -> None:
        self.token_ids.extend(token_ids)
        self.loss_mask.extend([mask] * len(token_ids))
        self.behaviour_logprobs.extend(logprobs if logprobs is not None else [0.0] * len(token_ids))

    def _add_message(self, role: str, content: str, start: int, **extra: Any) -> None:
        self.messages.append({"role": role, "content": content, "start": start, "end": len(self), **extra})

    def note_tool_call_outcome(self, status: str | None, error: str | None) -> None:
        """Record on the last message (the assistant turn just added) what became of its tool-call
        markup: ``status`` as :data:`tandem.contracts.ToolCallStatus`, and ``error`` why it made no call."""
        if status is not None:
            self.messages[-1]["tool_call_status"] = status
        if error:
            self.messages[-1]["tool_call_error"] = error

    def _append_messages(self, messages: Sequence[Message], pieces: Sequence[Sequence[int]], *,
                         generation_prompt: Sequence[int] = (), max_tokens: int | None) -> bool:
        """Append each message's tokens (masked), then the generation prompt that opens the next
        assistant message; nothing, and False, if they would pass ``max_tokens``."""
        if max_tokens is not None and len(self) + sum(map(len, pieces)) + len(generation_prompt) > max_tokens:
            return False
        for message, piece in zip(messages, pieces, strict=True):
            start = len(self)
            self._extend(piece, mask=0)
            self._add_message(message["role"], message.get("content") or "", start)
        self._turn_start = len(self)
        self._extend(generation_prompt, mask=0)
        return True


class PromptLayout(Protocol):
    """What the agent loop and the SFT phase need of a prompt format."""

    #: The format the policy writes tool calls in.
    tool_call_format: ToolCallFormat
    #: The token that ends an assistant turn (the sampler stops there).
    end_of_turn_id: int
    #: Tokens a turn may add beyond what is sampled (an appended end-of-turn token).
    turn_overhead: int

    def start(self, prompt: str, tools: Sequence[Tool], *, system: str | None = None) -> EpisodeTokens:
        """A new episode: the ``system`` text (if any) and ``prompt`` as the first user message, the
        ``tools`` shown as the format shows them, then the generation prompt."""
        ...

    def add_messages(self, episode: EpisodeTokens, messages: Sequence[Message], *,
                     max_tokens: int | None = None) -> bool: ...

    def add_sampled(self, episode: EpisodeTokens, token_ids: Sequence[int], logprobs: Sequence[float], *,
                    content: str, tool_calls: Sequence[Mapping[str, Any]] = ()) -> None: ...

    def add_demonstrated(self, episode: EpisodeTokens, content: str, *,
                         tool_calls: Sequence[Mapping[str, Any]] = ()) -> None: ...

    def add_replayed(self, episode: EpisodeTokens, token_ids: Sequence[int], *, content: str,
                     tool_calls: Sequence[Mapping[str, Any]] = ()) -> None:
        """An assistant turn given back as history (an agent's rewritten conversation): its tokens,
        closed by the end-of-turn token, in the context but never trained on."""
        ...


def _growth(texts: Iterable[str], refusal: Callable[[int], str]) -> list[str]:
    """What each text adds to the one before it (the first, all of it); each must extend the last.

    Raises:
      PromptFormatError: ``refusal(index)`` for the first text that rewrites what came before.
    """
    pieces, covered = [], ""
    for index, text in enumerate(texts):
        if not text.startswith(covered):
            raise PromptFormatError(refusal(index))
        pieces.append(text[len(covered):])
        covered = text
    return pieces


def _calls(tool_calls: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    return {"tool_calls": [dict(call) for call in tool_calls]} if tool_calls else {}


def _add_replayed(episode: EpisodeTokens, token_ids: Sequence[int], end_of_turn_id: int, *, content: str,
                  tool_calls: Sequence[Mapping[str, Any]]) -> None:
    ended = list(token_ids) if token_ids and token_ids[-1] == end_of_turn_id else [*token_ids, end_of_turn_id]
    episode._extend(ended, mask=0)
    episode._add_message("assistant", content, episode._turn_start, replayed=True, **_calls(tool_calls))


def tool_call_parse_formats(layout: PromptLayout) -> tuple[str, ...]:
    """The formats a policy's turn under ``layout`` is read in: its own, and for a byte-layout policy
    (the ``tandem`` format) also ``<tool_call>`` blocks, which models trained from scratch may learn."""
    return ("tandem", "qwen", "hermes") if layout.tool_call_format == "tandem" else (layout.tool_call_format,)


class ByteLayout:
    """The byte layout of :mod:`policy.byte_layout`, for models trained from scratch."""

    turn_overhead = 0

    def __init__(self, tokenizer: Tokenizer, *, tool_call_format: ToolCallFormat = "tandem"):
        self.tokenizer = tokenizer
        self.end_of_turn_id = tokenizer.eos_id
        self.tool_call_format = tool_call_format

    def start(self, prompt: str, tools: Sequence[Tool], *, system: str | None = None) -> EpisodeTokens:
        episode = EpisodeTokens(tools=tuple(tools))
        # The byte layout has no roles: a system text is the prompt's first paragraph.
        text = f"{system}\n\n{prompt}" if system else prompt
        episode._extend(opening_tokens(self.tokenizer, tool_names=[tool.name for tool in tools], prompt=text),
                        mask=0)
        episode._add_message("user", text, 0)
        episode._turn_start = len(episode)
        return episode

    def add_messages(self, episode: EpisodeTokens, messages: Sequence[Message], *,
                     max_tokens: int | None = None) -> bool:
        pieces = [self.tokenizer.encode(message.get("content") or "") for message in messages]
        return episode._append_messages(messages, pieces, max_tokens=max_tokens)

    def add_sampled(self, episode: EpisodeTokens, token_ids: Sequence[int], logprobs: Sequence[float], *,
                    content: str, tool_calls: Sequence[Mapping[str, Any]] = ()) -> None:
        episode._extend(token_ids, mask=1, logprobs=logprobs)
        episode._add_message("assistant", content, episode._turn_start, **_calls(tool_calls))

    def add_demonstrated(self, episode: EpisodeTokens, content: str, *,
                         tool_calls: Sequence[Mapping[str, Any]] = ()) -> None:
        episode._extend(demonstrated_tokens(self.tokenizer, content), mask=1)
        episode._add_message("assistant", content, episode._turn_start, **_calls(tool_calls))

    def add_replayed(self, episode: EpisodeTokens, token_ids: Sequence[int], *, content: str,
                     tool_calls: Sequence[Mapping[str, Any]] = ()) -> None:
        _add_replayed(episode, token_ids, self.end_of_turn_id, content=content, tool_calls=tool_calls)


class ChatTemplateLayout:
    """The tokenizer's chat template, appended to turn by turn; see the module docstring."""

    turn_overhead = 1

    def __init__(
        self,
        tokenizer: HFTokenizer,
        *,
        chat_template: str | None = None,
        tool_call_format: ToolCallFormat | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        past_reasoning: PastReasoning = "keep",
    ):
        source = chat_template if chat_template is not None else tokenizer.chat_template
        if source is None:
            raise PromptFormatError("prompt_format chat_template needs a tokenizer with a chat template")
        self.tokenizer = tokenizer
        self.source = source
        self.tool_call_format: ToolCallFormat = tool_call_format or tool_call_format_of_template(source)
        self.template_kwargs = dict(template_kwargs or {})
        self.past_reasoning = past_reasoning
        # A template that never mentions tools cannot show them; a system message does instead.
        self.renders_tools = "tools" in source
        self._roles: dict[str, bool] = {}
        self.end_of_turn_id = self._template_end_of_turn()
        self._end_of_turn = tokenizer.token(self.end_of_turn_id)

    def _template_end_of_turn(self) -> int:
        """The special token the template closes an assistant turn with (Gemma's ``<end_of_turn>``,
        not its ``<eos>``); the tokenizer's EOS when the template closes it with none."""
        text = self._render([{"role": "user", "content": _USER_STAND_IN},
                             {"role": "assistant", "content": _ASSISTANT_STAND_IN}], (), generation_prompt=False)
        after = self.tokenizer.encode(text[text.rfind(_ASSISTANT_STAND_IN) + 1:].lstrip(" "))
        if after and self.tokenizer.is_special(after[0]):
            return after[0]
        return self.tokenizer.eos_id

    def _render(self, messages: Sequence[Message], tools: Sequence[Tool], *, generation_prompt: bool) -> str:
        return render_text(
            messages, self.tokenizer, self.source, add_generation_prompt=generation_prompt,
            tools=tool_schemas(tools) if tools and self.renders_tools else None,
            template_kwargs=self.template_kwargs,
        )

    def _opening(self, prompt: str, tools: Sequence[Tool], system: str | None = None) -> list[Message]:
        instructions = tool_instructions(tools) if tools and not self.renders_tools else None
        system = "\n\n".join(part for part in (system, instructions) if part)
        if not system:
            return [{"role": "user", "content": prompt}]
        if self._renders_role("system", first=True):
            return [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
        # Templates without a system role (Gemma) get it in the first user message.
        return [{"role": "user", "content": f"{system}\n\n{prompt}"}]

    def _renders_role(self, role: str, *, first: bool = False) -> bool:
        """Whether the template renders a ``role`` message (first, or after an assistant turn)."""
        if role not in self._roles:
            stand_in = {"role": role, "content": _USER_STAND_IN}
            conversation = ([stand_in, {"role": "user", "content": _USER_STAND_IN}] if first else
                            [{"role": "user", "content": _USER_STAND_IN},
                             {"role": "assistant", "content": _ASSISTANT_STAND_IN}, stand_in])
            try:
                self._render(conversation, (), generation_prompt=True)
                self._roles[role] = True
            except ChatTemplateError:
                self._roles[role] = False
        return self._roles[role]

    def tool_role(self) -> str:
        """``tool`` if the template renders tool messages; ``user`` for templates that refuse them (Gemma)."""
        return "tool" if self._renders_role("tool") else "user"

    def start(self, prompt: str, tools: Sequence[Tool], *, system: str | None = None) -> EpisodeTokens:
        episode = EpisodeTokens(tools=tuple(tools))
        opening = self._opening(prompt, tools, system)
        full = self._render(opening, tools, generation_prompt=True)
        try:
            pieces = self._opening_pieces(opening, tools)
        except (ChatTemplateError, PromptFormatError):
            # A template that renders no prefix of the opening alone (a system message without
            # a user one, say): one piece, told apart from the generation prompt only.
            pieces = [self._render(opening, tools, generation_prompt=False), *[""] * (len(opening) - 1)]
        covered = ""
        for message, piece in zip(opening, pieces, strict=True):
            start = len(episode)
            episode._extend(self.tokenizer.encode(piece), mask=0)
            episode._add_message(message["role"], message["content"], start)
            covered += piece
        if not full.startswith(covered):
            raise PromptFormatError("the chat template's generation prompt rewrites the prompt before it")
        episode._turn_start = len(episode)
        episode._extend(self.tokenizer.encode(full[len(covered):]), mask=0)
        return episode

    def _opening_pieces(self, opening: Sequence[Message], tools: Sequence[Tool]) -> list[str]:
        """The text of each opening message, rendered one more message at a time."""
        return _growth(
            (self._render(opening[:count], tools, generation_prompt=False) for count in range(1, len(opening) + 1)),
            lambda index: "the chat template rewrites the system message once a user message follows",
        )

    def _new_message_pieces(self, messages: Sequence[Message], tools: Sequence[Tool]) -> tuple[list[str], str]:
        """The template's text for ``messages`` after an assistant turn, one piece per message, and
        the generation prompt after them.

        They are rendered after a stand-in conversation, and only the text after the stand-in
        assistant turn's end-of-turn token counts: how the template renders that history (a
        reasoning template rewrites it once messages follow) does not matter, as the episode's
        own history is its appended tokens.
        """
        base = [{"role": "user", "content": _USER_STAND_IN}, {"role": "assistant", "content": _ASSISTANT_STAND_IN}]

        def tail(count: int, generation_prompt: bool) -> str:
            text = self._render([*base, *messages[:count]], tools, generation_prompt=generation_prompt)
            assistant_at = text.rfind(_ASSISTANT_STAND_IN)
            end_of_turn_at = text.find(self._end_of_turn, assistant_at)
            if assistant_at < 0 or end_of_turn_at < 0:
                raise PromptFormatError(
                    "the chat template does not close an assistant turn with the end-of-turn token "
                    f"{self._end_of_turn!r}"
                )
            return text[end_of_turn_at + len(self._end_of_turn):]

        # The text after the end-of-turn token (a newline, usually) belongs to the first new message.
        pieces = _growth(
            (tail(count, False) for count in range(1, len(messages) + 1)),
            lambda index: f"the chat template rewrites messages[{index - 1}] when another follows it, so the "
                          "new messages' tokens cannot be told apart",
        )
        covered, prompted = "".join(pieces), tail(len(messages), True)
        if not prompted.startswith(covered):
            raise PromptFormatError("the chat template's generation prompt rewrites the messages before it")
        return pieces, prompted[len(covered):]

    def add_messages(self, episode: EpisodeTokens, messages: Sequence[Message], *,
                     max_tokens: int | None = None) -> bool:
        messages = [
            {**message, "role": self.tool_role()} if message["role"] == "tool" else dict(message)
            for message in messages
        ]
        if self.past_reasoning == "drop" and any(
            _REASONING.search(message.get("content") or "") for message in episode.messages
            if message["role"] == "assistant" and message["start"] >= episode.segment_starts[-1]
        ):
            return self._new_segment(episode, messages, max_tokens=max_tokens)
        texts, generation_prompt = self._new_message_pieces(messages, episode.tools)
        return episode._append_messages(messages, [self.tokenizer.encode(text) for text in texts],
                                        generation_prompt=self.tokenizer.encode(generation_prompt),
                                        max_tokens=max_tokens)

    def _new_segment(self, episode: EpisodeTokens, messages: Sequence[Message], *,
                     max_tokens: int | None) -> bool:
        """Continue in a new context: the whole conversation re-rendered without past reasoning."""
        history = [
            {"role": message["role"], "content": _REASONING.sub("", message["content"])
             if message["role"] == "assistant" else message["content"]}
            for message in episode.messages
        ]
        conversation = [*history, *messages]
        text = self._render(conversation, episode.tools, generation_prompt=True)
        token_ids = self.tokenizer.encode(text)
        # The record holds every segment, so the whole record must fit, not only the new context.
        if max_tokens is not None and len(episode) + len(token_ids) > max_tokens:
            return False
        start = len(episode)
        episode.segment_starts.append(start)
        episode._extend(token_ids, mask=0)
        for message in messages:
            episode._add_message(message["role"], message.get("content") or "", start)
        episode._turn_start = start
        return True

    def add_sampled(self, episode: EpisodeTokens, token_ids: Sequence[int], logprobs: Sequence[float], *,
                    content: str, tool_calls: Sequence[Mapping[str, Any]] = ()) -> None:
        episode._extend(token_ids, mask=1, logprobs=logprobs)
        if not token_ids or token_ids[-1] != self.end_of_turn_id:
            # Cut off at max_new_tokens: the turn is closed for the model's next context, but the
            # closing token was not sampled, so it is not trained on.
            episode._extend([self.end_of_turn_id], mask=0)
        episode._add_message("assistant", content, episode._turn_start, **_calls(tool_calls))

    def add_demonstrated(self, episode: EpisodeTokens, content: str, *,
                         tool_calls: Sequence[Mapping[str, Any]] = ()) -> None:
        episode._extend([*self.tokenizer.encode(content), self.end_of_turn_id], mask=1)
        episode._add_message("assistant", content, episode._turn_start, **_calls(tool_calls))

    def add_replayed(self, episode: EpisodeTokens, token_ids: Sequence[int], *, content: str,
                     tool_calls: Sequence[Mapping[str, Any]] = ()) -> None:
        _add_replayed(episode, token_ids, self.end_of_turn_id, content=content, tool_calls=tool_calls)


def prompt_layout(config: ModelConfig, tokenizer: Tokenizer) -> PromptLayout:
    """The layout ``config.prompt_format`` names for ``tokenizer`` (``auto``: its template if it has one).

    Raises:
      PromptFormatError: ``chat_template`` asked of a tokenizer without one, or ``drop``
        reasoning with the byte layout.
    """
    template = getattr(tokenizer, "chat_template", None)
    fmt = config.prompt_format
    if fmt == "auto":
        fmt = "chat_template" if template is not None else "byte"
    tool_format = None if config.tool_call_format == "auto" else config.tool_call_format
    if fmt == "byte":
        if config.past_reasoning == "drop":
            raise PromptFormatError("model.past_reasoning=drop needs model.prompt_format=chat_template")
        return ByteLayout(tokenizer, tool_call_format=tool_format or "tandem")
    if not isinstance(tokenizer, HFTokenizer) or template is None:
        raise PromptFormatError(
            "model.prompt_format=chat_template needs a tokenizer with a chat template "
            f"(model.tokenizer={config.tokenizer!r} has none)"
        )
    return ChatTemplateLayout(tokenizer, tool_call_format=tool_format, template_kwargs=config.chat_template_kwargs,
                              past_reasoning=config.past_reasoning)


