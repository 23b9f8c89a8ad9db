import asyncio
import random

import pytest

from environments import ToolError
from environments.builtin.calculator import (
    CalculatorEnvironment,
    CalculatorError,
    evaluate_expression,
)
from environments.tool_calls import parse_tool_call


def test_expressions_are_evaluated_without_eval():
    assert evaluate_expression("37*58") == 2146
    assert evaluate_expression("(2+3)*-4") == -20
    for hostile in ["__import__('os')", "2**100000", "1/0", "x+1", "9" * 70]:
        with pytest.raises(CalculatorError):
            evaluate_expression(hostile)


def test_right_answer_scores_one_and_anything_else_zero():
    async def play(action):
        env = CalculatorEnvironment()
        prompt = await env.reset({"expression": "12+30"})
        assert prompt == "12+30=?\n"
        return await env.step(action)

    assert asyncio.run(play("A:42")).reward == 1.0
    assert asyncio.run(play("A:41")).reward == 0.0
    malformed = asyncio.run(play("forty-two"))
    assert (malformed.reward, malformed.done, malformed.info["outcome"]) == (0.0, True, "malformed answer")


def test_calculator_tool_call_returns_the_result_as_an_observation():
    env = CalculatorEnvironment()
    call = parse_tool_call("calc(37*58)", env.tools)
    assert call is not None and call.arguments == {"expression": "37*58"}
    assert asyncio.run(call.tool.run(call.arguments)) == "=2146\n"
    assert parse_tool_call("A:2146", env.tools) is None
    assert parse_tool_call("search(37)", env.tools) is None


def test_an_expression_the_calculator_cannot_evaluate_is_a_tool_error_the_model_is_told_of():
    tool = CalculatorEnvironment().tools[0]
    for expression, message in (("2**8", "unsupported expression"), ("37*", "cannot parse"),
                                ("9" * 70, "expression too long")):
        with pytest.raises(ToolError, match=message):
            asyncio.run(tool.run({"expression": expression}))


def test_demonstrations_mix_tool_use_with_wrong_guesses():
    env = CalculatorEnvironment(tool_use_fraction=0.5)
    demos = env.demonstrations(400, random.Random(0))
    tool_demos = [d for d in demos if len(d.turns) == 3]
    guesses = [d for d in demos if len(d.turns) == 1]
    assert 150 < len(tool_demos) < 250 and len(tool_demos) + len(guesses) == 400
    for demo in tool_demos:
        expression = demo.prompt.removesuffix("=?\n")
        assert demo.turns[2].text == f"A:{evaluate_expression(expression)}"
    wrong = sum(
        1 for d in guesses if d.turns[0].text != f"A:{evaluate_expression(d.prompt.removesuffix('=?' + chr(10)))}"
    )
    assert wrong == len(guesses)


def test_tasks_are_reproducible_from_a_seed():
    env = CalculatorEnvironment()
    assert env.sample_task(random.Random(7)) == env.sample_task(random.Random(7))


def test_chat_style_asks_in_words_and_grades_the_last_number_of_the_reply():
    environment = CalculatorEnvironment(prompt_style="chat", min_operand=1, max_operand=9, operators="+")
    prompt = asyncio.run(environment.reset({"expression": "3+4"}))
    assert prompt == "What is 3+4? You may use the calc tool. End your reply with the answer."
    verdicts = {}
    for reply in ("3 + 4 = 7.", "The answer is 7", "It is 1,007", "7 or maybe 8", "seven"):
        asyncio.run(environment.reset({"expression": "3+4"}))
        result = asyncio.run(environment.step(reply))
        verdicts[reply] = (result.reward, result.info["outcome"])
    assert verdicts == {"3 + 4 = 7.": (1.0, "correct"), "The answer is 7": (1.0, "correct"),
                        "It is 1,007": (0.0, "wrong"), "7 or maybe 8": (0.0, "wrong"),
                        "seven": (0.0, "malformed answer")}
    demo = environment.demonstrations(1, random.Random(0))[0]
    assert demo.prompt.startswith("What is ") and demo.turns[-1].text.endswith(
        f"= {evaluate_expression(demo.prompt.split()[2].rstrip('?'))}")
    with pytest.raises(ValueError, match="prompt_style"):
        CalculatorEnvironment(prompt_style="shouty")
