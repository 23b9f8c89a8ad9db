"""The shop: prices only its lookup tool knows, different at every shop, summed with calc; through the
real agent loop (a scripted policy says the turns, in SmolLM2's Hermes format under its real template)."""

from __future__ import annotations

import asyncio
import random

import pytest

from environments import ToolError, format_tool_call
from environments.builtin.shop import ShopEnvironment, order_total, price
from policy import ChatTemplateLayout, load_tokenizer
from tests.workers.test_tool_call_feedback import scripted_episode

TASK = {"shop": 48213, "order": [["lamp", 3], ["chair", 2]]}


def test_prices_are_fixed_per_shop_and_differ_between_shops():
    assert price(48213, "lamp") == price(48213, "lamp")
    assert len({price(shop, "lamp") for shop in range(10_000, 10_050)}) > 20
    assert order_total(TASK) == 3 * price(48213, "lamp") + 2 * price(48213, "chair")


def test_lookup_answers_for_the_episodes_shop_and_names_what_it_sells_when_asked_for_something_else():
    environment = ShopEnvironment()
    prompt = asyncio.run(environment.reset(TASK))
    assert "3 lamps and 2 chairs" in prompt and "#48213" in prompt
    lookup = environment.tools[0]
    assert asyncio.run(lookup.run({"item": "lamps"})) == f"lamp: ${price(48213, 'lamp')}\n"
    with pytest.raises(ToolError, match="this shop sells no 'sofa'; it sells lamp"):
        asyncio.run(lookup.run({"item": "sofa"}))


def test_only_the_total_as_the_last_number_is_rewarded():
    environment = ShopEnvironment()
    asyncio.run(environment.reset(TASK))
    total = order_total(TASK)
    assert asyncio.run(environment.step(f"3 lamps and 2 chairs come to ${total:,}.")).reward == 1.0
    assert asyncio.run(environment.step(f"${total}, or maybe {total + 1}")).reward == 0.0
    assert asyncio.run(environment.step("I cannot know")).reward == 0.0


def test_held_out_orders_are_never_drawn_for_training_and_demonstrations_add_up():
    environment = ShopEnvironment()
    rng = random.Random(0)
    training = [environment.sample_task(rng) for _ in range(300)]
    evaluation = [environment.sample_evaluation_task(rng) for _ in range(30)]
    assert not any(map(environment.is_held_out, training)) and all(map(environment.is_held_out, evaluation))
    for demo in environment.demonstrations(20, random.Random(1)):
        policy_turns = [turn.text for turn in demo.turns if turn.role == "policy"]
        if len(policy_turns) > 1:  # one that looks the prices up: each lookup, one calc, the total
            assert [text.split("(")[0] for text in policy_turns[:-1]] == ["lookup"] * (len(policy_turns) - 2) + ["calc"]
        assert policy_turns[-1].startswith("The total is $")


@pytest.mark.parametrize("uses_tools", [True, False])
def test_an_episode_needs_both_tools_to_earn_its_reward(smollm2, uses_tools):
    tokenizer = load_tokenizer(str(smollm2))
    layout = ChatTemplateLayout(tokenizer)
    lamp, chair = price(48213, "lamp"), price(48213, "chair")
    if uses_tools:
        turns = [format_tool_call("lookup", {"item": "lamp"}, "hermes"),
                 format_tool_call("lookup", {"item": "chair"}, "hermes"),
                 format_tool_call("calc", {"expression": f"3*{lamp}+2*{chair}"}, "hermes"),
                 f"The total is ${order_total(TASK)}."]
    else:
        turns = ["Lamps are usually $20 and chairs $30, so the total is $120."]
    record = scripted_episode(tokenizer, layout, ShopEnvironment(), TASK, turns, max_turns=6, name="shop")
    assert record.status == "ok" and record.offered_tools == ("lookup", "calc")
    called = [call.name for message in record.messages for call in message.tool_calls]
    if uses_tools:
        assert called == ["lookup", "lookup", "calc"] and record.reward == 1.0
        assert [message.content for message in record.messages if message.role == "tool"] == \
            [f"lamp: ${lamp}\n", f"chair: ${chair}\n", f"={order_total(TASK)}\n"]
    else:
        assert order_total(TASK) != 120  # the guess is wrong at this shop
        assert called == [] and record.reward == 0.0


def test_the_registered_shop_and_calculator_presets_pass_their_registration_probe():
    """The platform writes their tool schemas out (it never imports environment code); the probe
    fails a version whose declaration drifts from what the class exposes."""
    from environment_registry.builtin import CALCULATOR_PRODUCTS, SHOP
    from tandem.contracts import ProbeRequest
    from workers.probe import run_probe

    for spec in (SHOP, CALCULATOR_PRODUCTS):
        checks = run_probe(ProbeRequest(probe_id=1, purpose="registration", environment=spec)).model_dump()["checks"]
        assert [check["name"] for check in checks if check["status"] != "passed"] == [], checks
        assert "tools" in [check["name"] for check in checks]
