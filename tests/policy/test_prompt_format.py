"""Episodes in the model's own format: chat templates appended token in, token out, tools and tool calls.

The real SmolLM2-135M-Instruct tokenizer (make models) carries every template
here: its own, which knows no tools, and small templates written in the shapes
of Qwen's (tools as JSON schemas, ``<tool_call>`` blocks, tool results as user
turns), of a reasoning model's (earlier ``<think>`` blocks dropped from
history) and of Gemma's (no tool role).
"""

from __future__ import annotations

import json
import random

import pytest

from environments import (
    Demonstration,
    DemonstrationTurn,
    demonstration_messages,
    format_tool_call,
    parse_tool_calls,
    tool_call_format_of_template,
)
from environments.builtin.calculator import CALCULATOR_TOOL, CalculatorEnvironment
from policy import (
    ByteLayout,
    ByteTokenizer,
    ChatTemplateLayout,
    Conversation,
    PromptFormatError,
    load_tokenizer,
    prompt_layout,
)
from policy.chat_template import render_text
from tandem.configs.model import ModelConfig

QWEN_LIKE = (
    "{% if tools %}{{ '<|im_start|>system\\n# Tools\\n<tools>' }}{% for tool in tools %}"
    "{{ '\\n' + (tool | tojson) }}{% endfor %}"
    "{{ '\\n</tools>\\nCall a tool with <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Drops the reasoning of every assistant turn but the last, as Qwen3's template does.
REASONING = (
    "{% for message in messages %}"
    "{% if message.role == 'assistant' and not loop.last and '</think>' in message.content %}"
    "{{ '<|im_start|>assistant\\n' + message.content.split('</think>')[-1].lstrip('\\n') + '<|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
NO_TOOL_ROLE = (
    "{% for message in messages %}"
    "{% if message.role not in ['user', 'assistant'] %}{{ raise_exception('roles must be user or assistant') }}{% endif %}"
    "{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3_LIKE = (
    "{% for message in messages %}"
    "{% set role = 'ipython' if message.role == 'tool' else message.role %}"
    "{{ '<|im_start|>' + role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    return load_tokenizer(str(smollm2))


def sample(tokenizer, text: str, *, closed: bool = True) -> tuple[list[int], list[float]]:
    """Tokens as a sampler would produce ``text``: the turn's tokens, then the end-of-turn token."""
    ids = tokenizer.encode(text) + ([tokenizer.eos_id] if closed else [])
    return ids, [-0.5] * len(ids)


def full_text(tokenizer, token_ids) -> str:
    return tokenizer._tokenizer.decode(token_ids, skip_special_tokens=False)


def test_smollm2_episode_is_its_template_with_tools_in_a_system_message_and_only_sampled_tokens_trained(tokenizer):
    layout = ChatTemplateLayout(tokenizer)
    assert layout.tool_call_format == "hermes" and not layout.renders_tools
    episode = layout.start("What is 37*58?", [CALCULATOR_TOOL])
    prompt_length = len(episode)
    text = full_text(tokenizer, episode.token_ids)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>user\nWhat is 37*58?<|im_end|>\n"
                                                                      "<|im_start|>assistant\n")
    schema = json.dumps({"type": "function", "function": {
        "name": "calc", "description": CALCULATOR_TOOL.description, "parameters": CALCULATOR_TOOL.parameters}})
    assert schema in text and "<tool_call>" in text

    call = format_tool_call("calc", {"expression": "37*58"}, "hermes")
    call_ids, call_logprobs = sample(tokenizer, call)
    layout.add_sampled(episode, call_ids, call_logprobs, content=call,
                       tool_calls=[{"name": "calc", "arguments": {"expression": "37*58"}}])
    assert layout.add_messages(episode, [{"role": "tool", "content": "=2146\n"}])
    answer_ids, answer_logprobs = sample(tokenizer, "A:2146")
    layout.add_sampled(episode, answer_ids, answer_logprobs, content="A:2146")

    # Token in, token out: the sequence is the prompt, then exactly what was sampled and what came back.
    assert episode.token_ids[prompt_length:prompt_length + len(call_ids)] == call_ids
    assert episode.token_ids[-len(answer_ids):] == answer_ids
    trained = [token for token, mask in zip(episode.token_ids, episode.loss_mask, strict=True) if mask]
    assert trained == call_ids + answer_ids
    assert [lp for lp, mask in zip(episode.behaviour_logprobs, episode.loss_mask, strict=True) if mask] == \
        call_logprobs + answer_logprobs
    # For this prefix-stable template it is also what the template makes of the whole conversation.
    messages = [{"role": m["role"], "content": m["content"]} for m in episode.messages]
    assert full_text(tokenizer, episode.token_ids) == render_text(messages, tokenizer, tokenizer.chat_template,
                                                                  add_generation_prompt=False).rstrip("\n")
    assert [m["role"] for m in episode.messages] == ["system", "user", "assistant", "tool", "assistant"]
    # The generation prompt opens the assistant message and is masked; the tool turn is masked.
    assistant = episode.messages[2]
    header = episode.token_ids[assistant["start"]:prompt_length]
    assert full_text(tokenizer, header) == "<|im_start|>assistant\n"
    assert not any(episode.loss_mask[assistant["start"]:prompt_length])
    assert episode.messages[2]["tool_calls"] == [{"name": "calc", "arguments": {"expression": "37*58"}}]
    tool = episode.messages[3]
    assert full_text(tokenizer, episode.token_ids[tool["start"]:tool["end"]]) == "\n<|im_start|>tool\n=2146\n<|im_end|>\n"
    assert not any(episode.loss_mask[tool["start"]:tool["end"]])


def test_a_turn_cut_off_at_max_new_tokens_is_closed_with_an_untrained_end_of_turn_token(tokenizer):
    layout = ChatTemplateLayout(tokenizer)
    episode = layout.start("Count to ten.", [])
    ids, logprobs = sample(tokenizer, "1, 2, 3", closed=False)
    layout.add_sampled(episode, ids, logprobs, content="1, 2, 3")
    assert episode.token_ids[-1] == tokenizer.eos_id and episode.loss_mask[-1] == 0
    assert sum(episode.loss_mask) == len(ids)


def test_qwen_like_template_gets_the_tools_as_json_schemas_and_its_tool_calls_are_parsed_natively(tokenizer):
    layout = ChatTemplateLayout(tokenizer, chat_template=QWEN_LIKE)
    assert layout.renders_tools and layout.tool_call_format == "qwen"
    episode = layout.start("What is 2+3?", [CALCULATOR_TOOL])
    text = full_text(tokenizer, episode.token_ids)
    assert text.startswith("<|im_start|>system\n# Tools\n<tools>\n")
    assert json.loads(text.split("<tools>\n")[1].split("\n</tools>")[0])["function"]["name"] == "calc"
    assert [m["role"] for m in episode.messages] == ["user"]  # no system message of Tandem's own

    reply = '<tool_call>\n{"name": "calc", "arguments": {"expression": "2+3"}}\n</tool_call>'
    parsed = parse_tool_calls(reply, [CALCULATOR_TOOL], formats=(layout.tool_call_format,))
    assert [(call.tool.name, call.arguments) for call in parsed.calls] == [("calc", {"expression": "2+3"})]
    ids, logprobs = sample(tokenizer, reply)
    layout.add_sampled(episode, ids, logprobs, content=reply)
    layout.add_messages(episode, [{"role": "tool", "content": "=5"}])
    assert full_text(tokenizer, episode.token_ids).endswith(
        "</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n=5\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")


def test_llama3_and_gemma_like_templates_get_their_own_call_format_and_tool_role(tokenizer):
    assert tool_call_format_of_template(LLAMA3_LIKE) == "llama3"
    call = format_tool_call("calc", {"expression": "6*7"}, "llama3")
    assert json.loads(call) == {"name": "calc", "parameters": {"expression": "6*7"}}
    parsed = parse_tool_calls(call, [CALCULATOR_TOOL], formats=("llama3",))
    assert parsed.calls[0].arguments == {"expression": "6*7"}
    assert parse_tool_calls('{"name": "nope", "parameters": {}}', [CALCULATOR_TOOL], formats=("llama3",)).error

    layout = ChatTemplateLayout(tokenizer, chat_template=NO_TOOL_ROLE)
    assert layout.tool_role() == "user"
    # No system role either: the tool instructions open the first user message.
    episode = layout.start("What is 6*7?", [CALCULATOR_TOOL])
    assert [m["role"] for m in episode.messages] == ["user"]
    assert episode.messages[0]["content"].startswith("You may call these tools") and \
        episode.messages[0]["content"].endswith("\n\nWhat is 6*7?")
    ids, logprobs = sample(tokenizer, "A:42")
    layout.add_sampled(episode, ids, logprobs, content="A:42")
    layout.add_messages(episode, [{"role": "tool", "content": "=42"}])
    assert full_text(tokenizer, episode.token_ids).endswith("<|im_start|>user\n=42<|im_end|>\n<|im_start|>assistant\n")
    assert episode.messages[-1]["role"] == "user"


def test_history_a_reasoning_template_rewrites_keeps_the_appended_tokens_or_starts_a_new_segment(tokenizer):
    thought = "<think>\n37*58 is hard; use the tool.\n</think>\n"
    reply = thought + '<tool_call>\n{"name": "calc", "arguments": {"expression": "37*58"}}\n</tool_call>'
    ids, logprobs = sample(tokenizer, reply)

    keep = ChatTemplateLayout(tokenizer, chat_template=REASONING, past_reasoning="keep")
    episode = keep.start("What is 37*58?", [CALCULATOR_TOOL])
    keep.add_sampled(episode, ids, logprobs, content=reply)
    keep.add_messages(episode, [{"role": "tool", "content": "=2146"}])
    # The template re-renders the first turn without its reasoning ...
    messages = [{"role": m["role"], "content": m["content"]} for m in episode.messages]
    rerendered = render_text(messages, tokenizer, REASONING, add_generation_prompt=True)
    assert "<think>" not in rerendered
    # ... but the next turn is sampled from what was appended: the reasoning as sampled, untouched.
    context = episode.context()
    assert "37*58 is hard" in full_text(tokenizer, context)
    first_sampled = episode.loss_mask.index(1)
    assert context[first_sampled:first_sampled + len(ids)] == ids
    assert episode.segment_starts == [0]

    drop = ChatTemplateLayout(tokenizer, chat_template=REASONING, past_reasoning="drop")
    episode = drop.start("What is 37*58?", [CALCULATOR_TOOL])
    drop.add_sampled(episode, ids, logprobs, content=reply)
    first_segment = list(episode.token_ids)
    drop.add_messages(episode, [{"role": "tool", "content": "=2146"}])
    assert len(episode.segment_starts) == 2 and episode.segment_starts[1] == len(first_segment)
    # The first segment keeps the turn as sampled (trained on in its own context) ...
    assert episode.token_ids[:len(first_segment)] == first_segment and sum(episode.loss_mask) == len(ids)
    # ... and the next turn's context is the template's history, without the reasoning.
    assert full_text(tokenizer, episode.context()) == full_text(tokenizer, tokenizer.encode(rerendered))
    assert not any(episode.loss_mask[episode.segment_starts[1]:])

    # The budget bounds the whole record, every segment of it: one token short, nothing is appended.
    tight = ChatTemplateLayout(tokenizer, chat_template=REASONING, past_reasoning="drop")
    short = tight.start("What is 37*58?", [CALCULATOR_TOOL])
    tight.add_sampled(short, ids, logprobs, content=reply)
    before = list(short.token_ids)
    assert not tight.add_messages(short, [{"role": "tool", "content": "=2146"}], max_tokens=len(episode) - 1)
    assert short.token_ids == before and short.segment_starts == [0]


def test_demonstrations_render_their_tool_calls_in_the_models_format(tokenizer):
    demo = Demonstration(prompt="What is 2+3?", turns=(
        DemonstrationTurn("policy", "calc(2+3)"), DemonstrationTurn("environment", "=5\n"),
        DemonstrationTurn("policy", "A:5")))
    messages = demonstration_messages(demo, [CALCULATOR_TOOL], "hermes")
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
    assert messages[1]["content"] == format_tool_call("calc", {"expression": "2+3"}, "hermes")

    layout = ChatTemplateLayout(tokenizer)
    episode = layout.start(messages[0]["content"], [CALCULATOR_TOOL])
    for message in messages[1:]:
        if message["role"] == "assistant":
            layout.add_demonstrated(episode, message["content"])
        else:
            layout.add_messages(episode, [message])
    trained = [token for token, mask in zip(episode.token_ids, episode.loss_mask, strict=True) if mask]
    eos = tokenizer.eos_id
    assert trained == tokenizer.encode(messages[1]["content"]) + [eos] + tokenizer.encode("A:5") + [eos]


def test_byte_layout_is_todays_conversation_layout_byte_for_byte():
    tokenizer = ByteTokenizer()
    environment = CalculatorEnvironment()
    for demo in environment.demonstrations(8, random.Random(0)):
        expected = Conversation.start(tokenizer, tool_names=["calc"], prompt=demo.prompt)
        for turn in demo.turns:
            (expected.add_policy_text if turn.role == "policy" else expected.add_environment)(turn.text)
        layout = ByteLayout(tokenizer)
        messages = demonstration_messages(demo, environment.tools, layout.tool_call_format)
        episode = layout.start(messages[0]["content"], environment.tools)
        for message in messages[1:]:
            if message["role"] == "assistant":
                layout.add_demonstrated(episode, message["content"])
            else:
                layout.add_messages(episode, [message])
        assert (episode.token_ids, episode.loss_mask) == (expected.token_ids, expected.loss_mask)


def test_prompt_format_auto_follows_the_tokenizer_and_refuses_what_cannot_work(smollm2, tokenizer):
    hf = str(smollm2)
    assert isinstance(prompt_layout(ModelConfig(tokenizer=hf), tokenizer), ChatTemplateLayout)
    assert isinstance(prompt_layout(ModelConfig(tokenizer=hf, prompt_format="byte"), tokenizer), ByteLayout)
    assert isinstance(prompt_layout(ModelConfig(), ByteTokenizer()), ByteLayout)
    # The run config refuses what can never work, naming the field; the layout refuses the rest.
    with pytest.raises(ValueError, match="model.prompt_format=chat_template needs a model.tokenizer"):
        ModelConfig(prompt_format="chat_template")
    with pytest.raises(ValueError, match="model.past_reasoning=drop needs a chat template"):
        ModelConfig(past_reasoning="drop")
    with pytest.raises(PromptFormatError, match="past_reasoning=drop needs model.prompt_format=chat_template"):
        prompt_layout(ModelConfig(tokenizer=hf, prompt_format="byte").model_copy(
            update={"past_reasoning": "drop"}), tokenizer)
    layout = prompt_layout(ModelConfig(tokenizer=hf, tool_call_format="llama3"), tokenizer)
    assert layout.tool_call_format == "llama3"


def test_a_template_that_cannot_render_the_system_message_alone_still_opens_the_episode(tokenizer):
    needs_a_user = (
        "{% if messages[-1].role == 'system' %}{{ raise_exception('a user message must follow') }}{% endif %}"
        "{% for message in messages %}{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    layout = ChatTemplateLayout(tokenizer, chat_template=needs_a_user)
    episode = layout.start("What is 2+3?", [CALCULATOR_TOOL])
    messages = [{"role": m["role"], "content": m["content"]} for m in episode.messages]
    assert [m["role"] for m in messages] == ["system", "user"]
    assert full_text(tokenizer, episode.token_ids) == render_text(messages, tokenizer, needs_a_user,
                                                                  add_generation_prompt=True)
    assert not any(episode.loss_mask)


def test_the_end_of_turn_token_is_the_templates_own_not_necessarily_eos(tokenizer):
    # Like Gemma's <end_of_turn>, which is not its <eos>: here <|endoftext|> closes turns, <|im_end|> is EOS.
    own_end = (
        "{% for message in messages %}{{ '<|im_start|>' + message.role + '\\n' + message.content + '<|endoftext|>\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    layout = ChatTemplateLayout(tokenizer, chat_template=own_end)
    end_of_text = tokenizer._tokenizer.token_to_id("<|endoftext|>")
    assert layout.end_of_turn_id == end_of_text != tokenizer.eos_id
    episode = layout.start("Hi", [])
    ids = tokenizer.encode("Hello") + [end_of_text]
    layout.add_sampled(episode, ids, [-0.1] * len(ids), content="Hello")
    assert episode.token_ids[-1] == end_of_text and episode.loss_mask[-1] == 1  # sampled, so trained
    layout.add_messages(episode, [{"role": "user", "content": "Again"}])
    assert full_text(tokenizer, episode.token_ids).endswith(
        "Hello<|endoftext|>\n<|im_start|>user\nAgain<|endoftext|>\n<|im_start|>assistant\n")
    assert ChatTemplateLayout(tokenizer).end_of_turn_id == tokenizer.eos_id  # SmolLM2's: <|im_end|>
