"""Tool-call parsing: Tandem's name(arg), and the JSON <tool_call> formats of Qwen and Hermes."""

from __future__ import annotations

import pytest

from environments.base import Tool
from environments.builtin.calculator import CALCULATOR_TOOL
from environments.builtin.shop import ShopEnvironment
from environments.tool_calls import parse_tool_call, parse_tool_calls, tool_instructions
from policy import Completion

TOOLS = [CALCULATOR_TOOL]


def test_tandem_calls_fill_the_first_required_parameter():
    call = parse_tool_call("calc(37*58)", TOOLS)
    assert call.tool is CALCULATOR_TOOL and call.arguments == {"expression": "37*58"}


@pytest.mark.parametrize("text", ["A:2146", "sqrt(4)", "calc(1+1) and more", ""])
def test_text_that_is_not_a_declared_call_is_an_action(text):
    parsed = parse_tool_calls(text, TOOLS)
    assert parsed.calls == [] and parsed.error is None
    assert parse_tool_call(text, TOOLS) is None


def test_qwen_json_call_with_reasoning_around_it():
    text = 'Let me compute.\n<tool_call>\n{"name": "calc", "arguments": {"expression": "37*58"}}\n</tool_call>'
    parsed = parse_tool_calls(text, TOOLS)
    assert parsed.format == "qwen" and [c.arguments for c in parsed.calls] == [{"expression": "37*58"}]


def test_qwen_coder_xml_call():
    text = "<tool_call>\n<function=calc>\n<parameter=expression>\n2*3\n</parameter>\n</function>\n</tool_call>"
    assert parse_tool_call(text, TOOLS).arguments == {"expression": "2*3"}


def test_double_encoded_arguments_are_decoded():
    text = '<tool_call>{"name": "calc", "arguments": "{\\"expression\\": \\"1+2\\"}"}</tool_call>'
    assert parse_tool_call(text, TOOLS).arguments == {"expression": "1+2"}


def test_hermes_turns_may_make_several_calls_in_order():
    text = ('<tool_call>{"name": "calc", "arguments": {"expression": "1+1"}}</tool_call>\n'
            '<tool_call>{"arguments": {"expression": "2+2"}, "name": "calc"}</tool_call>')
    parsed = parse_tool_calls(text, TOOLS, formats=("hermes",))
    assert parsed.format == "hermes"
    assert [c.arguments["expression"] for c in parsed.calls] == ["1+1", "2+2"]
    assert parse_tool_call(text, TOOLS).arguments == {"expression": "1+1"}


def test_a_block_may_list_its_calls_as_smollm2_writes_them():
    """SmolLM2's function-calling data (APIGen) puts a JSON list in one block; each runs, in order."""
    text = '<tool_call>[\n{"name": "calc", "arguments": {"expression": "1+1"}},\n' \
           '{"name": "calc", "arguments": {"expression": "2*3"}}\n]</tool_call>'
    parsed = parse_tool_calls(text, TOOLS)
    assert parsed.status == "ok" and [c.arguments["expression"] for c in parsed.calls] == ["1+1", "2*3"]


@pytest.mark.parametrize(("text", "error"), [
    ('<tool_call>{"name": "calc", "arguments": {</tool_call>', "tool call is not valid JSON"),
    ('<tool_call>["calc"]</tool_call>', "tool call is not a JSON object"),
    ('<tool_call>[]</tool_call>', "tool call is an empty list"),
    ('<tool_call>[{"name": "calc", "arguments": {"expression": "1"}}, {"name": "rm"}]</tool_call>', "unknown tool 'rm'"),
    ('<tool_call>{"arguments": {}}</tool_call>', "tool call has no string 'name'"),
    ('<tool_call>{"name": "rm", "arguments": {}}</tool_call>', "unknown tool 'rm'"),
    ('<tool_call>{"name": "calc", "arguments": [1]}</tool_call>', "arguments of 'calc' are not a JSON object"),
    ('<tool_call>{"name": "calc", "arguments": {}}', "<tool_call> without </tool_call>"),
    ('<tool_call>{"name": "calc", "arguments": {"expression": "1"}}</tool_call><tool_call>oops</tool_call>',
     "tool call is not valid JSON"),
])
def test_malformed_json_calls_are_no_call_with_a_reason(text, error):
    parsed = parse_tool_calls(text, TOOLS)
    assert parsed.calls == [] and parsed.error.startswith(error)
    assert parse_tool_call(text, TOOLS) is None


def test_formats_can_be_restricted():
    text = '<tool_call>{"name": "calc", "arguments": {"expression": "1+1"}}</tool_call>'
    assert parse_tool_call(text, TOOLS, formats=("tandem",)) is None
    assert parse_tool_call("calc(1+1)", TOOLS, formats=("qwen", "hermes")) is None
    with pytest.raises(ValueError, match="unknown tool-call formats"):
        parse_tool_calls("calc(1)", TOOLS, formats=("openai",))


def test_no_tools_means_no_calls():
    assert parse_tool_call("calc(1+1)", []) is None


class ScriptedPolicy:
    """Says the scripted turns in order, as a policy would (byte tokens, log-probability 0)."""

    def __init__(self, turns):
        self.turns = list(turns)

    async def generate(self, token_ids, *, session_id):
        text = self.turns.pop(0).encode()
        return Completion(token_ids=list(text), logprobs=[0.0] * len(text), finished=True, stop_reason="eos",
                          policy_version=1, last_policy_version=1)

    def end_session(self, session_id):
        pass


def _agent_episode(environment, task, turns, max_turns=4):
    import asyncio

    from policy.tokenizer import ByteTokenizer
    from workers.agent import EpisodeLimits, run_episode
    from workers.circuit_breaker import CircuitBreakers

    limits = EpisodeLimits(max_turns=max_turns, max_seq_len=512, max_new_tokens=128, environment_timeout_s=5)
    record = asyncio.run(run_episode(
        run_id=1, group_id="1-0", group_size=1, environment_name="scripted", environment=environment, task=task,
        policy=ScriptedPolicy(turns), limits=limits, circuit_breakers=CircuitBreakers(),
    ))
    return record, ByteTokenizer().decode(record.token_ids)


def test_the_agent_runs_every_call_of_a_hermes_turn_and_shows_the_results():
    from environments.builtin.calculator import CalculatorEnvironment

    turns = ['<tool_call>{"name": "calc", "arguments": {"expression": "1+1"}}</tool_call>'
             '<tool_call>{"name": "calc", "arguments": {"expression": "2*2"}}</tool_call>', "A:2"]
    record, transcript = _agent_episode(CalculatorEnvironment(), {"expression": "1+1"}, turns)
    assert record.status == "ok" and record.reward == 1.0 and record.num_turns == 2
    assert "</tool_call>=2\n=4\nA:2" in transcript


def test_a_malformed_json_call_is_answered_and_the_calculator_still_gets_its_answer():
    from environments.builtin.calculator import CalculatorEnvironment

    record, transcript = _agent_episode(CalculatorEnvironment(), {"expression": "1+1"},
                                        ["<tool_call>{oops</tool_call>", "A:2"])
    assert record.status == "ok" and record.reward == 1.0 and record.num_turns == 2
    assert "tool call is not valid JSON" in transcript


def test_a_guessing_game_episode_rewards_binary_search_through_the_agent():
    from environments.builtin.guessing_game import GuessingGameEnvironment

    record, transcript = _agent_episode(GuessingGameEnvironment(), {"target": 37}, ["A:50", "A:25", "A:37"])
    assert record.status == "ok" and record.num_turns == 3 and abs(record.reward - 0.81) < 1e-9
    assert "A:50lower\nA:25higher\nA:37" in transcript


def test_tool_calls_are_timed_apart_from_the_environments_reset_and_step():
    import asyncio
    import dataclasses

    from environments.builtin.calculator import CALCULATOR_TOOL, CalculatorEnvironment

    async def slow_calculator(arguments):
        await asyncio.sleep(0.2)
        return await CALCULATOR_TOOL.run(arguments)

    class SlowToolCalculator(CalculatorEnvironment):
        tools = (dataclasses.replace(CALCULATOR_TOOL, run=slow_calculator),)

    turns = ['<tool_call>{"name": "calc", "arguments": {"expression": "1+1"}}</tool_call>', "A:2"]
    record, _ = _agent_episode(SlowToolCalculator(), {"expression": "1+1"}, turns)

    assert record.status == "ok" and record.reward == 1.0
    assert 0.2 <= record.timings.tool_s < 0.5
    assert record.timings.environment_s < 0.1  # reset and the final step only


def test_tool_instructions_end_with_an_example_call_from_the_schemas_examples():
    """A model that knows no tool format copies a whole call; the example comes from the first tool
    whose required parameters declare JSON Schema ``examples``, and none is made up."""
    instructions = tool_instructions(ShopEnvironment().tools)
    example = instructions.rsplit("For example: ", 1)[1]
    assert example == '<tool_call>{"name": "lookup", "arguments": {"item": "lamp"}}</tool_call>'
    assert [c.arguments for c in parse_tool_calls(example, ShopEnvironment().tools).calls] == [{"item": "lamp"}]
    bare = Tool(name="echo", description="Echoes.", run=CALCULATOR_TOOL.run,
                parameters={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})
    assert "For example" not in tool_instructions([bare])
    assert tool_instructions([bare, CALCULATOR_TOOL]).endswith(
        '<tool_call>{"name": "calc", "arguments": {"expression": "37*58"}}</tool_call>')


def test_an_episode_records_which_calls_copied_the_tools_example():
    """The agent loop marks a call whose arguments are the example the instructions show; the tool still runs it."""
    from environments.builtin.calculator import CalculatorEnvironment

    turns = ['<tool_call>{"name": "calc", "arguments": {"expression": "37*58"}}</tool_call>'
             '<tool_call>{"name": "calc", "arguments": {"expression": "942*714"}}</tool_call>', "A:672588"]
    record, transcript = _agent_episode(CalculatorEnvironment(), {"expression": "942*714"}, turns)
    assert record.status == "ok" and record.reward == 1.0
    assert "=2146\n=672588" in transcript  # the copy ran
    [calling] = [message for message in record.messages if message.tool_calls]
    assert [(call.arguments["expression"], call.copies_example) for call in calling.tool_calls] == [
        ("37*58", True), ("942*714", False)]
    assert record.tool_calls_run() == 2 and record.example_copies_run() == 1
