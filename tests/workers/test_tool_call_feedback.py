"""A call that does not parse, names an unknown tool or fails the tool's schema is answered, in the
model's own format, and the episode goes on: SmolLM2's Hermes blocks under its real chat template, and
the Llama 3 JSON calls under a template of Llama 3's shape (tool results in the ``ipython`` role), with
the real SmolLM2 tokenizer (make models) and the real agent loop; a scripted policy says the turns."""

from __future__ import annotations

import asyncio

import pytest

from environments import format_tool_call
from environments.builtin.calculator import CalculatorEnvironment
from policy import ChatTemplateLayout, Completion, load_tokenizer
from tests.policy.test_prompt_format import LLAMA3_LIKE
from workers.agent import EpisodeLimits, run_episode
from workers.circuit_breaker import CircuitBreakers


class ScriptedTurns:
    """Says each scripted text, ended by the template's end-of-turn token, in place of the engine."""

    def __init__(self, tokenizer, layout, turns):
        self.tokenizer, self.layout, self.turns = tokenizer, layout, list(turns)

    async def generate(self, token_ids, *, session_id):
        tokens = [*self.tokenizer.encode(self.turns.pop(0)), self.layout.end_of_turn_id]
        return Completion(token_ids=tokens, logprobs=[-0.1] * len(tokens), finished=True, stop_reason="eos",
                          policy_version=1, last_policy_version=1)

    def end_session(self, session_id):
        pass


def scripted_episode(tokenizer, layout, environment, task, turns, *, max_turns, name="calculator"):
    """One episode of the real agent loop whose policy says ``turns`` under ``layout``."""
    return asyncio.run(run_episode(
        run_id=1, group_id="1-0", group_size=1, environment_name=name, environment=environment, task=task,
        policy=ScriptedTurns(tokenizer, layout, turns), tokenizer=tokenizer, layout=layout,
        limits=EpisodeLimits(max_turns=max_turns, max_seq_len=2048, max_new_tokens=64, environment_timeout_s=5),
        circuit_breakers=CircuitBreakers()))


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    return load_tokenizer(str(smollm2))


def _layouts(tokenizer):
    return {"hermes": ChatTemplateLayout(tokenizer),
            "llama3": ChatTemplateLayout(tokenizer, chat_template=LLAMA3_LIKE, tool_call_format="llama3")}


def _failed_calls(fmt: str) -> list[tuple[str, str, str]]:
    """(turn text, status, a part of the reason) for each way a call can fail, written in ``fmt``."""
    unknown = format_tool_call("sqrt", {"expression": "16"}, fmt)
    wrong_argument = format_tool_call("calc", {"formula": "2+3"}, fmt)
    wrong_type = format_tool_call("calc", {"expression": 5}, fmt)
    broken = ('<tool_call>{"name": "calc", "arguments": {"expression": "2+3"</tool_call>' if fmt == "hermes"
              else '{"name": "calc", "parameters": {"expression": "2+3"}')
    return [(broken, "unparsed", "tool call is not valid JSON"),
            (unknown, "unknown_tool", "unknown tool 'sqrt'; the tools are calc"),
            (wrong_argument, "invalid_arguments", "'expression' is a required property"),
            (wrong_type, "invalid_arguments", "5 is not of type 'string'")]


@pytest.mark.parametrize("fmt", ["hermes", "llama3"])
def test_each_failed_call_is_told_to_the_model_in_its_format_and_the_episode_still_answers(tokenizer, fmt):
    layout = _layouts(tokenizer)[fmt]
    assert layout.tool_call_format == fmt
    failures = _failed_calls(fmt)
    good_call = format_tool_call("calc", {"expression": "2+3"}, fmt)
    turns = [text for text, _, _ in failures] + [good_call, "A:5"]
    record = scripted_episode(tokenizer, layout, CalculatorEnvironment(), {"expression": "2+3"}, turns, max_turns=8)

    # Four failed attempts, a call that ran, and the answer: none of the failures was the answer.
    assert record.status == "ok" and record.reward == 1.0 and record.num_turns == len(turns)
    assert record.offered_tools == ("calc",) and record.tool_calls_run() == 1
    assistant = [message for message in record.messages if message.role == "assistant"]
    answers = [message for message in record.messages if message.role == "tool"]
    assert [message.tool_call_status for message in assistant] == \
        [status for _, status, _ in failures] + ["ok", None]
    for message, told, (_, _, reason) in zip(assistant, answers, failures, strict=False):
        assert reason in message.tool_call_error and message.tool_calls == ()
        assert told.content == f"error: {message.tool_call_error}"
    assert answers[len(failures)].content.strip() == "=5"  # the call that parsed ran (the calculator says "=5")
    # Each error reached the model inside its template's own tool turn.
    transcript = tokenizer._tokenizer.decode(record.token_ids, skip_special_tokens=False)
    tool_turn = "<|im_start|>ipython\n" if fmt == "llama3" else ""
    for message in answers[:len(failures)]:
        assert f"{tool_turn}{message.content}" in transcript
    # Only what the policy said is trained on; the tool turns are masked out.
    for message in answers:
        assert not any(record.loss_mask[message.start:message.end])


def test_a_tool_that_refuses_a_call_answers_with_its_error_and_the_episode_goes_on(tokenizer):
    """A ToolError is the tool's answer, not the environment's fault: the turn records tool_error, the
    model reads why, and it may try again."""
    layout = _layouts(tokenizer)["hermes"]
    turns = [format_tool_call("calc", {"expression": "2**8"}, "hermes"),
             format_tool_call("calc", {"expression": "2*2*2*2*2*2*2*2"}, "hermes"), "A:256"]
    record = scripted_episode(tokenizer, layout, CalculatorEnvironment(), {"expression": "16*16"}, turns, max_turns=4)
    assert record.status == "ok" and record.reward == 1.0
    refused, ran, _answer = [message for message in record.messages if message.role == "assistant"]
    assert refused.tool_call_status == "tool_error" and "calc: unsupported expression" in refused.tool_call_error
    assert ran.tool_call_status == "ok" and record.tool_calls_run() == 1  # a refused call ran for nothing
    told = [message.content for message in record.messages if message.role == "tool"]
    assert told[0].startswith("error: unsupported expression") and told[1] == "=256\n"
