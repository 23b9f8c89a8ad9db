"""The same calculator agent as openai_react_agent.py, written with the OpenAI Agents SDK: no Tandem import.

The SDK speaks the Responses API by default; the episode's endpoint serves chat completions, so the SDK
is told to use them, with a client that reads OPENAI_BASE_URL and OPENAI_API_KEY from the environment.
"""

from __future__ import annotations

import json
import os
import random
import sys

import httpx
from agents import (
    Agent,
    Runner,
    function_tool,
    set_default_openai_api,
    set_default_openai_client,
    set_tracing_disabled,
)
from openai import AsyncOpenAI


@function_tool
def calc(expression: str) -> str:
    """Evaluate an arithmetic expression of integers, + - and *."""
    if not all(character in "0123456789+-* ()" for character in expression) or len(expression) > 64:
        return "error: only integers, + - * and parentheses"
    return str(eval(expression, {"__builtins__": {}}))  # noqa: S307 - checked to be arithmetic above


def main() -> int:
    task = json.loads(os.environ["TANDEM_TASK"])
    rng = random.Random(task["seed"])
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    client = AsyncOpenAI()
    set_default_openai_client(client, use_for_tracing=False)
    set_default_openai_api("chat_completions")
    set_tracing_disabled(True)
    agent = Agent(name="calculator", instructions="Use calc, then answer with the number.", tools=[calc],
                  model=os.environ.get("TANDEM_MODEL", "policy"))
    result = Runner.run_sync(agent, f"{a}+{b}=", max_turns=4)
    reward = 1.0 if str(a + b) in str(result.final_output) else 0.0
    httpx.post(f"{client.base_url}reward", json={"reward": reward},
               headers={"Authorization": f"Bearer {client.api_key}"}, timeout=30).raise_for_status()
    return 0


if __name__ == "__main__":
    sys.exit(main())
