"""Built-in multi-turn arithmetic task with a calculator tool.

The policy sees ``37*58=?``, may call ``calc(37*58)``, reads ``=2146`` back
as an observation, then answers ``A:2146``. Guessing almost never pays, so a
policy that learns to use the tool is visibly better than one that guesses.

``prompt_style="chat"`` asks in words, for pretrained instruct models ("What
is 37*58? ..."), and grades a reply as people read one: by the last number in
it ("37 * 58 = 2146." is right).

A tenth of the expressions, fixed by their hash, are held out: training and
demonstrations never draw them, evaluation draws only them.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from typing import Any

from environments.base import (
    Demonstration,
    DemonstrationTurn,
    Environment,
    StepResult,
    Tool,
    ToolError,
    draw_from_split,
    stable_fraction,
)

#: Share of expressions held out for evaluation, chosen by each expression's stable hash.
EVALUATION_FRACTION = 0.1

_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
}
_ANSWER = re.compile(r"^\s*A:\s*(-?\d+)\s*$")
_NUMBER = re.compile(r"-?\d+")
PROMPT_STYLES = ("terse", "chat")
# Bounds keep the tool from being turned into a CPU burner by a silly expression.
_MAX_EXPRESSION_CHARS = 64
_MAX_ABS_VALUE = 10**12


class CalculatorError(ValueError):
    pass


def evaluate_expression(expression: str) -> int:
    """Integer + - * with parentheses; anything else is refused, never eval'd."""
    if len(expression) > _MAX_EXPRESSION_CHARS:
        raise CalculatorError("expression too long")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise CalculatorError(f"cannot parse {expression!r}") from exc

    def visit(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return visit(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -visit(node.operand)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            value = _OPERATORS[type(node.op)](visit(node.left), visit(node.right))
            if abs(value) > _MAX_ABS_VALUE:
                raise CalculatorError("result out of range")
            return value
        raise CalculatorError(f"unsupported expression {expression!r}")

    return visit(tree)


async def _calculator_tool(arguments: dict[str, Any]) -> str:
    try:
        return f"={evaluate_expression(str(arguments.get('expression', '')))}\n"
    except CalculatorError as exc:
        raise ToolError(str(exc)) from exc


CALCULATOR_TOOL = Tool(
    name="calc",
    description="Evaluates an integer arithmetic expression with + - * and parentheses.",
    parameters={
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "e.g. 37*58", "examples": ["37*58"]}},
        "required": ["expression"],
    },
    run=_calculator_tool,
)


class CalculatorEnvironment(Environment):
    tools = (CALCULATOR_TOOL,)

    def __init__(self, *, min_operand: int = 2, max_operand: int = 99, operators: str = "+-*",
                 tool_use_fraction: float = 0.5, prompt_style: str = "terse"):
        """``tool_use_fraction``: share of demonstrations that use the tool;
        the rest guess, so SFT alone leaves room for RL to improve.
        ``prompt_style``: ``terse`` (``37*58=?``, for byte models trained from scratch)
        or ``chat`` (a question in words, for instruct models)."""
        if not 0 <= min_operand <= max_operand:
            raise ValueError("min_operand must be between 0 and max_operand")
        if not operators or set(operators) - set("+-*"):
            raise ValueError("operators must be a non-empty subset of '+-*'")
        if prompt_style not in PROMPT_STYLES:
            raise ValueError(f"prompt_style must be one of {PROMPT_STYLES}, got {prompt_style!r}")
        self.prompt_style = prompt_style
        self.min_operand = min_operand
        self.max_operand = max_operand
        self.operators = operators
        self.tool_use_fraction = tool_use_fraction
        self._answer: int | None = None

    def _any_task(self, rng: random.Random) -> dict[str, Any]:
        a = rng.randint(self.min_operand, self.max_operand)
        b = rng.randint(self.min_operand, self.max_operand)
        op = rng.choice(self.operators)
        return {"expression": f"{a}{op}{b}"}

    @staticmethod
    def is_held_out(task: dict[str, Any]) -> bool:
        """Whether ``task`` is one of the expressions kept for evaluation (a tenth of them)."""
        return stable_fraction(task["expression"]) < EVALUATION_FRACTION

    def sample_task(self, rng: random.Random) -> dict[str, Any]:
        return draw_from_split(lambda: self._any_task(rng), held_out=self.is_held_out, evaluation=False)

    def sample_evaluation_task(self, rng: random.Random) -> dict[str, Any]:
        return draw_from_split(lambda: self._any_task(rng), held_out=self.is_held_out, evaluation=True)

    def _prompt(self, expression: str) -> str:
        if self.prompt_style == "chat":
            return f"What is {expression}? You may use the calc tool. End your reply with the answer."
        return f"{expression}=?\n"

    def _answer_text(self, expression: str, answer: int) -> str:
        return f"{expression} = {answer}" if self.prompt_style == "chat" else f"A:{answer}"

    def _given_answer(self, action: str) -> int | None:
        if self.prompt_style == "chat":
            numbers = _NUMBER.findall(action.replace(",", ""))
            return int(numbers[-1]) if numbers else None
        match = _ANSWER.match(action)
        return int(match.group(1)) if match else None

    async def reset(self, task: dict[str, Any]) -> str:
        expression = str(task["expression"])
        self._answer = evaluate_expression(expression)
        return self._prompt(expression)

    async def step(self, action: str) -> StepResult:
        if self._answer is None:
            raise RuntimeError("step() called before reset()")
        given = self._given_answer(action)
        if given is None:
            return StepResult("", 0.0, True, {"outcome": "malformed answer"})
        correct = given == self._answer
        return StepResult("", 1.0 if correct else 0.0, True, {"outcome": "correct" if correct else "wrong"})

    def demonstrations(self, count: int, rng: random.Random) -> list[Demonstration]:
        demos = []
        for _ in range(count):
            expression = self.sample_task(rng)["expression"]
            answer = evaluate_expression(expression)
            if rng.random() < self.tool_use_fraction:
                turns = (
                    DemonstrationTurn("policy", f"calc({expression})"),
                    DemonstrationTurn("environment", f"={answer}\n"),
                    DemonstrationTurn("policy", self._answer_text(expression, answer)),
                )
            else:
                # An imperfect demonstrator: a guess of the right size, rarely right.
                guess = answer + rng.choice([-1, 1]) * rng.randint(1, max(2, abs(answer) // 4 + 1))
                turns = (DemonstrationTurn("policy", self._answer_text(expression, guess)),)
            demos.append(Demonstration(prompt=self._prompt(expression), turns=turns))
        return demos
