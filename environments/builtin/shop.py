"""Built-in multi-step task that needs two different tools: a shop's prices, then their sum.

Each task is an order at one of many shops, say ``3 lamps and 2 chairs at shop #48213``, and
asks for its total. Every shop prices its items differently, fixed by the shop's number, so no
price can be remembered from training: the policy must ``lookup`` each item's price (the tool
answers for the episode's shop only), then combine them with ``calc`` (or in its head, if it can)
and end its reply with the total. The reward checks the final answer only: the last number in
the reply, 1.0 when it is the total.

A tenth of the orders, fixed by their hash, are held out: training and demonstrations never
draw them, evaluation draws only them.
"""

from __future__ import annotations

import hashlib
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
from environments.builtin.calculator import CALCULATOR_TOOL

#: Share of orders held out for evaluation, chosen by each order's stable hash.
EVALUATION_FRACTION = 0.1
#: What the shops sell (singular, plural).
ITEMS = {
    "lamp": "lamps", "chair": "chairs", "table": "tables", "kettle": "kettles", "mirror": "mirrors",
    "basket": "baskets", "candle": "candles", "clock": "clocks", "rug": "rugs", "vase": "vases",
}
MIN_PRICE, MAX_PRICE = 11, 99
_NUMBER = re.compile(r"-?\d+")

LOOKUP_TOOL_PARAMETERS = {
    "type": "object",
    "properties": {"item": {"type": "string", "description": "an item the shop sells, e.g. lamp", "examples": ["lamp"]}},
    "required": ["item"],
}
LOOKUP_TOOL_DESCRIPTION = "Looks up the price, in dollars, of one item at this episode's shop."


def price(shop: int, item: str) -> int:
    """``item``'s price at ``shop``: the same in every process, different from shop to shop."""
    digest = hashlib.sha256(f"{shop}:{item}".encode()).digest()
    return MIN_PRICE + int.from_bytes(digest[:4], "big") % (MAX_PRICE - MIN_PRICE + 1)


def order_total(task: dict[str, Any]) -> int:
    return sum(count * price(task["shop"], item) for item, count in task["order"])


def _singular(name: str) -> str:
    name = name.strip().lower()
    for item, plural in ITEMS.items():
        if name in (item, plural):
            return item
    return name


class ShopEnvironment(Environment):
    """An order's total at one shop, from prices only the ``lookup`` tool knows; ``calc`` adds them up."""

    def __init__(self, *, min_items: int = 2, max_items: int = 3, max_count: int = 5,
                 tool_use_fraction: float = 0.5):
        """``min_items``..``max_items`` different items an order holds, each 1..``max_count`` of;
        ``tool_use_fraction``: the share of demonstrations that look the prices up (the rest guess a
        total, so SFT alone leaves room for RL)."""
        if not 1 <= min_items <= max_items <= len(ITEMS):
            raise ValueError(f"need 1 <= min_items <= max_items <= {len(ITEMS)}")
        if max_count < 1:
            raise ValueError("max_count must be at least 1")
        self.min_items, self.max_items, self.max_count = min_items, max_items, max_count
        self.tool_use_fraction = tool_use_fraction
        self._task: dict[str, Any] | None = None
        self.tools = (
            Tool(name="lookup", description=LOOKUP_TOOL_DESCRIPTION, parameters=LOOKUP_TOOL_PARAMETERS,
                 run=self._lookup),
            CALCULATOR_TOOL,
        )

    async def _lookup(self, arguments: dict[str, Any]) -> str:
        if self._task is None:
            raise RuntimeError("lookup called before reset()")
        item = _singular(str(arguments.get("item", "")))
        if item not in ITEMS:
            raise ToolError(f"this shop sells no {item!r}; it sells {', '.join(ITEMS)}")
        return f"{item}: ${price(self._task['shop'], item)}\n"

    def _any_task(self, rng: random.Random) -> dict[str, Any]:
        items = rng.sample(sorted(ITEMS), rng.randint(self.min_items, self.max_items))
        return {"shop": rng.randint(10_000, 99_999), "order": [[item, rng.randint(1, self.max_count)] for item in items]}

    @staticmethod
    def is_held_out(task: dict[str, Any]) -> bool:
        """Whether ``task`` is one of the orders kept for evaluation (a tenth of them)."""
        return stable_fraction(task) < EVALUATION_FRACTION

    def sample_task(self, rng: random.Random) -> dict[str, Any]:
        return draw_from_split(lambda: self._any_task(rng), held_out=self.is_held_out, evaluation=False)

    def sample_evaluation_task(self, rng: random.Random) -> dict[str, Any]:
        return draw_from_split(lambda: self._any_task(rng), held_out=self.is_held_out, evaluation=True)

    @staticmethod
    def _prompt(task: dict[str, Any]) -> str:
        parts = [f"{count} {item if count == 1 else ITEMS[item]}" for item, count in task["order"]]
        order = ", ".join(parts[:-1]) + f" and {parts[-1]}"
        return (f"At shop #{task['shop']}, what do {order} cost in total? Prices differ from shop to shop: "
                "look each one up with the lookup tool, use calc for the arithmetic, and end your reply "
                "with the total in dollars.")

    async def reset(self, task: dict[str, Any]) -> str:
        self._task = task
        return self._prompt(task)

    async def step(self, action: str) -> StepResult:
        if self._task is None:
            raise RuntimeError("step() called before reset()")
        numbers = _NUMBER.findall(action.replace(",", ""))
        if not numbers:
            return StepResult("", 0.0, True, {"outcome": "no total"})
        correct = int(numbers[-1]) == order_total(self._task)
        return StepResult("", 1.0 if correct else 0.0, True, {"outcome": "correct" if correct else "wrong"})

    def demonstrations(self, count: int, rng: random.Random) -> list[Demonstration]:
        demos = []
        for _ in range(count):
            task = self.sample_task(rng)
            total = order_total(task)
            if rng.random() < self.tool_use_fraction:
                turns = []
                for item, _count in task["order"]:
                    turns += [DemonstrationTurn("policy", f"lookup({item})"),
                              DemonstrationTurn("environment", f"{item}: ${price(task['shop'], item)}\n")]
                expression = "+".join(f"{count}*{price(task['shop'], item)}" for item, count in task["order"])
                turns += [DemonstrationTurn("policy", f"calc({expression})"),
                          DemonstrationTurn("environment", f"={total}\n"),
                          DemonstrationTurn("policy", f"The total is ${total}.")]
            else:
                # An imperfect demonstrator: a total of the right size, rarely right.
                guess = total + rng.choice([-1, 1]) * rng.randint(1, max(2, total // 4))
                turns = [DemonstrationTurn("policy", f"The total is ${guess}.")]
            demos.append(Demonstration(prompt=self._prompt(task), turns=tuple(turns)))
        return demos
