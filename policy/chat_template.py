"""Chat templates: a multi-turn conversation as token ids plus the mask of the model's tokens.

Live episodes and demonstrations do not come through :func:`render_chat`: they
are appended to turn by turn (:mod:`policy.prompt_format`, which renders each
new piece with :func:`render_text`), so no template ever rewrites their
history. :func:`render_chat` renders a whole finished conversation at once,
as ``transformers``' ``apply_chat_template`` does, with its assistant mask.

:func:`render_chat` turns ``[{"role": ..., "content": ...}, ...]`` (roles
system, user, assistant, tool) into ``token_ids`` and an ``assistant_mask``
that is 1 exactly on the assistant's tokens, each turn's end-of-turn token
included, and 0 on everything the template or the environment adds (role
headers, the newline after the end-of-turn token, tool results).

Two kinds of template:

- A Jinja ``chat_template`` (a Hugging Face tokenizer's, or one passed in),
  rendered as ``transformers`` does (sandboxed, ``trim_blocks``,
  ``lstrip_blocks``, ``raise_exception``, ``tojson``, ``strftime_now``).
  The conversation is rendered once per message prefix and tokenized piece by
  piece: the text up to the assistant header, the header (the template's
  generation prompt), the assistant's turn. Tokens therefore never merge
  across a turn boundary, which is also how a sampler produces them: it
  appends sampled tokens to the tokenized prompt. The model's part of a turn
  is what follows the generation prompt up to and including the first
  end-of-turn token; in a template with ``{% generation %}`` markers
  (transformers' ``return_assistant_tokens_mask``) it is the marked text,
  extended to the end-of-turn token if the markers leave it out. A template must be
  *prefix-stable* (rendering more messages only appends text); templates that
  rewrite earlier turns (e.g. Qwen3's, which drops the reasoning of earlier
  assistant turns) are refused with an error.
- For the byte tokenizer, a built-in template with the layout of
  :mod:`policy.byte_layout` (the one the nano policy is trained on): BOS, the tool
  header, then messages back to back, each assistant turn followed by EOS.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from policy.byte_layout import opening_tokens
from policy.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer

Message = Mapping[str, Any]

_ROLES = ("system", "user", "assistant", "tool")
# Private-use characters around {% generation %} output; stripped before tokenizing.
_OPEN, _CLOSE = "\ue000", "\ue001"


class ChatTemplateError(ValueError):
    """A conversation the template cannot render with an exact assistant mask."""


@dataclass(frozen=True)
class RenderedChat:
    """A conversation as the model sees it."""

    # Token ids of the whole conversation.
    token_ids: list[int]
    # 1 on the assistant's tokens (its end-of-turn token included), 0 elsewhere.
    assistant_mask: list[int]


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"chat template error: {message}")


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


@functools.lru_cache(maxsize=1)
def _jinja_environment() -> Any:
    """The sandboxed environment transformers renders chat templates in.

    jinja2 is imported here, not at module level: only Jinja templates need
    it, and the byte tokenizer's built-in template must work without it.
    """
    try:
        import jinja2.ext
        import jinja2.nodes
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise ChatTemplateError("Jinja chat templates need the jinja2 package") from None

    class GenerationBlocks(jinja2.ext.Extension):
        """Accepts ``{% generation %}...{% endgeneration %}`` (transformers' assistant markers).

        Their content is enclosed in sentinel characters, which the renderer
        strips and turns into the exact span of the assistant's own text.
        """

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            call = self.call_method("_mark", [])
            return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

        def _mark(self, caller: Callable[[], str]) -> str:
            return _OPEN + caller() + _CLOSE

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, GenerationBlocks],
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
    return environment


def _check_messages(messages: Sequence[Message]) -> None:
    for index, message in enumerate(messages):
        if message.get("role") not in _ROLES:
            raise ChatTemplateError(
                f"messages[{index}].role={message.get('role')!r} is not one of {_ROLES}"
            )


def _strip_generation_marks(text: str) -> tuple[str, list[tuple[int, int]]]:
    """``text`` without the generation sentinels, and the [start, end) spans they enclosed."""
    parts, spans, length, start = [], [], 0, 0
    for part in re.split(f"([{_OPEN}{_CLOSE}])", text):
        if part == _OPEN:
            start = length
        elif part == _CLOSE:
            spans.append((start, length))
        else:
            parts.append(part)
            length += len(part)
    return "".join(parts), spans


@functools.lru_cache(maxsize=8)
def _compiled(source: str) -> Any:
    return _jinja_environment().from_string(source)


def render_text(
    messages: Sequence[Message],
    tokenizer: HFTokenizer,
    source: str,
    *,
    add_generation_prompt: bool,
    tools: Sequence[Any] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The text the Jinja template ``source`` makes of ``messages``, as transformers renders it.

    Raises:
      ChatTemplateError: the template raised, or failed to render.
    """
    _check_messages(messages)
    return _strip_generation_marks(
        _render_source(messages, tokenizer, source, add_generation_prompt=add_generation_prompt,
                       tools=tools, template_kwargs=template_kwargs or {})
    )[0]


def _render_source(
    messages: Sequence[Message],
    tokenizer: HFTokenizer,
    source: str,
    *,
    add_generation_prompt: bool,
    tools: Sequence[Any] | None,
    template_kwargs: Mapping[str, Any],
) -> str:
    context = {
        "bos_token": "" if tokenizer.bos_id is None else tokenizer.token(tokenizer.bos_id),
        "eos_token": tokenizer.token(tokenizer.eos_id),
        "pad_token": tokenizer.token(tokenizer.pad_id),
        "tools": list(tools) if tools is not None else None,
        **template_kwargs,
    }
    try:
        return _compiled(source).render(
            messages=[dict(message) for message in messages],
            add_generation_prompt=add_generation_prompt,
            **context,
        )
    except ChatTemplateError:
        raise
    except Exception as exc:  # noqa: BLE001 - a template bug is the template's, named as such
        raise ChatTemplateError(f"the chat template failed: {type(exc).__name__}: {exc}") from exc


def _render_jinja(
    messages: Sequence[Message],
    tokenizer: HFTokenizer,
    source: str,
    *,
    add_generation_prompt: bool,
    tools: Sequence[Any] | None,
    end_of_turn_id: int,
    template_kwargs: Mapping[str, Any],
) -> RenderedChat:
    def render(count: int, generation_prompt: bool) -> tuple[str, list[tuple[int, int]]]:
        return _strip_generation_marks(
            _render_source(messages[:count], tokenizer, source, add_generation_prompt=generation_prompt,
                           tools=tools, template_kwargs=template_kwargs)
        )

    token_ids: list[int] = []
    mask: list[int] = []
    covered = ""  # the rendered text tokenized so far

    def advance(text: str, where: str) -> str:
        """The new text past ``covered``, which ``text`` must extend."""
        nonlocal covered
        if not text.startswith(covered):
            raise ChatTemplateError(
                f"the chat template is not prefix-stable at {where}: rendering more messages "
                "changed the text of earlier ones, so no exact assistant mask exists"
            )
        new, covered = text[len(covered) :], text
        return new

    def context_tokens(text: str) -> None:
        piece = tokenizer.encode(text)
        token_ids.extend(piece)
        mask.extend([0] * len(piece))

    def model_turn(pieces: list[tuple[str, bool]], where: str) -> None:
        """Tokenize (text, is_model) pieces of an assistant turn, piece by piece.

        The model's tokens are the marked ones, cut after the first end-of-turn
        token among them, or extended up to the first one after them when they
        hold none (markers that leave the end-of-turn token outside).
        """
        turn_ids: list[int] = []
        turn_mask: list[int] = []
        for text, is_model in pieces:
            piece = tokenizer.encode(text) if text else []
            turn_ids.extend(piece)
            turn_mask.extend([int(is_model)] * len(piece))
        marked = [i for i, flag in enumerate(turn_mask) if flag]
        ends = [i for i in marked if turn_ids[i] == end_of_turn_id]
        if ends:
            turn_mask[ends[0] + 1 :] = [0] * (len(turn_mask) - ends[0] - 1)
        else:
            after = marked[-1] + 1 if marked else 0
            if end_of_turn_id not in turn_ids[after:]:
                raise ChatTemplateError(
                    f"{where}: the template's assistant turn lacks the end-of-turn token "
                    f"{tokenizer.token(end_of_turn_id)!r} (id {end_of_turn_id})"
                )
            end = turn_ids.index(end_of_turn_id, after)
            turn_mask[after : end + 1] = [1] * (end + 1 - after)
        token_ids.extend(turn_ids)
        mask.extend(turn_mask)

    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if message["role"] != "assistant":
            context_tokens(advance(render(index + 1, False)[0], where))
            continue
        header = advance(render(index, True)[0], f"{where} (its generation prompt)")
        context_tokens(header)
        start = len(covered)
        text, spans = render(index + 1, False)
        body = advance(text, where)
        own_spans = [(begin - start, end - start) for begin, end in spans if begin >= start]
        if own_spans:  # {% generation %} markers say exactly what the model wrote
            pieces, position = [], 0
            for begin, end in own_spans:
                pieces += [(body[position:begin], False), (body[begin:end], True)]
                position = end
            model_turn([*pieces, (body[position:], False)], where)
        elif header:  # the model writes everything after the generation prompt
            model_turn([(body, True)], where)
        else:
            raise ChatTemplateError(
                f"{where}: the chat template adds nothing for add_generation_prompt and has no "
                "{% generation %} markers, so where the assistant's own tokens start is unknown"
            )
    if add_generation_prompt:
        context_tokens(advance(render(len(messages), True)[0], "the generation prompt"))
    return RenderedChat(token_ids=token_ids, assistant_mask=mask)


def _tool_names(tools: Sequence[Any]) -> list[str]:
    """Names of OpenAI-style tool specs ({"function": {"name": ...}}), {"name": ...} or strings."""
    names = []
    for tool in tools:
        if isinstance(tool, str):
            names.append(tool)
        else:
            names.append(tool.get("function", tool)["name"])
    return names


def _render_byte(
    messages: Sequence[Message],
    tokenizer: ByteTokenizer,
    *,
    tools: Sequence[Any] | None,
    end_of_turn_id: int,
) -> RenderedChat:
    token_ids = opening_tokens(tokenizer, tool_names=_tool_names(tools or []), prompt="")
    mask = [0] * len(token_ids)
    for message in messages:
        piece = tokenizer.encode(message.get("content") or "")
        if message["role"] == "assistant":
            token_ids.extend([*piece, end_of_turn_id])
            mask.extend([1] * (len(piece) + 1))
        else:
            token_ids.extend(piece)
            mask.extend([0] * len(piece))
    return RenderedChat(token_ids=token_ids, assistant_mask=mask)


def render_chat(
    messages: Sequence[Message],
    tokenizer: Tokenizer,
    *,
    chat_template: str | None = None,
    add_generation_prompt: bool = False,
    tools: Sequence[Any] | None = None,
    end_of_turn_id: int | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> RenderedChat:
    """Token ids of ``messages`` and the mask of the assistant's tokens.

    Args:
      messages: dicts with ``role`` (system, user, assistant, tool) and ``content``;
        other keys (``tool_calls``, ``name``) are passed to a Jinja template as is.
      tokenizer: a :class:`ByteTokenizer` (built-in template) or an :class:`HFTokenizer`.
      chat_template: Jinja source; None takes the tokenizer's (an HFTokenizer must have one).
      add_generation_prompt: append the assistant header, to sample the next turn.
      tools: tool specs handed to the template (the byte template lists their names).
      end_of_turn_id: the token closing an assistant turn; None: ``tokenizer.eos_id``.
      template_kwargs: extra template variables (e.g. ``enable_thinking``).
    Raises:
      ChatTemplateError: an unknown role, a template that is not prefix-stable, or an
        assistant turn without the end-of-turn token.
    """
    _check_messages(messages)
    end_of_turn_id = tokenizer.eos_id if end_of_turn_id is None else end_of_turn_id
    if isinstance(tokenizer, ByteTokenizer) and chat_template is None:
        return _render_byte(messages, tokenizer, tools=tools, end_of_turn_id=end_of_turn_id)
    if not isinstance(tokenizer, HFTokenizer):
        raise ChatTemplateError(
            "a Jinja chat template needs an HFTokenizer (special tokens in text)"
        )
    source = chat_template if chat_template is not None else tokenizer.chat_template
    if source is None:
        raise ChatTemplateError("the tokenizer has no chat_template; pass chat_template")
    return _render_jinja(
        messages,
        tokenizer,
        source,
        add_generation_prompt=add_generation_prompt,
        tools=tools,
        end_of_turn_id=end_of_turn_id,
        template_kwargs=template_kwargs or {},
    )
