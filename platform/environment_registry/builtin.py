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
                "properties": {"expression": {"type": "string", "description": "e.g. 37*58", "examples": ["37*58"]}},
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

# Products a model cannot work out in its head (3 digits by 3), asked in words: the calculator is needed.
CALCULATOR_PRODUCTS = CALCULATOR.model_copy(update={
    "name": "calculator-products",
    "settings": {"prompt_style": "chat", "min_operand": 100, "max_operand": 999, "operators": "*"},
})

# An order's total at a shop whose prices only its lookup tool knows: two different tools, several calls.
SHOP = EnvironmentSpec(
    name="shop",
    kind="python",
    entrypoint="environments.builtin.shop:ShopEnvironment",
    settings={},
    tools=(
        ToolSchema(
            name="lookup",
            description="Looks up the price, in dollars, of one item at this episode's shop.",
            parameters={
                "type": "object",
                "properties": {"item": {"type": "string", "description": "an item the shop sells, e.g. lamp",
                                        "examples": ["lamp"]}},
                "required": ["item"],
            },
        ),
        CALCULATOR.tools[0],
    ),
)

BUILTIN_ENVIRONMENTS = (CALCULATOR, CALCULATOR_CHAT, CALCULATOR_PRODUCTS, SHOP)
