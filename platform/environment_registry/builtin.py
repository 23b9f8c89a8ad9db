"""Environments that ship with Tandem and are registered by ``tandem_bootstrap``.

Their tool schemas are written out here, not imported from workers/ (the
platform never imports producer code); the probe fails a version whose
declaration drifts from what the class exposes.
"""

from tandem.contracts import EnvironmentSpec, ToolSchema

CALCULATOR = EnvironmentSpec(
    name="calculator",
    kind="python",
    entrypoint="environments.builtin.calculator:CalculatorEnvironment",
    settings={},
    tools=(
        ToolSchema(
            name="calc",
            description="Evaluates an integer arithmetic expression with + - * and parentheses.",
            parameters={
                "type": "object",
                "properties": {"expression": {"type": "string", "description": "e.g. 37*58"}},
                "required": ["expression"],
            },
        ),
    ),
)

# The same task asked in words, for pretrained instruct models (tandem up --demo --model smollm2).
CALCULATOR_CHAT = CALCULATOR.model_copy(update={
    "name": "calculator-chat",
    "settings": {"prompt_style": "chat", "min_operand": 1, "max_operand": 9, "operators": "+"},
})

BUILTIN_ENVIRONMENTS = (CALCULATOR, CALCULATOR_CHAT)
