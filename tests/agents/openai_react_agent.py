"""A ReAct-style agent written against the ``openai`` client alone: no Tandem import.

Tandem runs it once per episode (an operator lists it in TANDEM_AGENT_COMMANDS) with OPENAI_BASE_URL and
OPENAI_API_KEY set to the episode's endpoint, and TANDEM_TASK to its task (``{"seed": n}``). It asks the
model a sum derived from the seed, offers one tool, ``calc``, runs the tool itself when the model calls
it, and sends the reward: 1.0 when the final answer holds the sum, else 0.0.

With ``--rewrite`` it rewrites its history before its last call, as agents that manage their context do:
it drops its earlier turns (``--rewrite`` or ``--rewrite=drop``), edits its question (``--rewrite=edit``),
or summarises its earlier turns in one message (``--rewrite=summarise``). With ``--stream`` it asks for
streamed answers (and a temperature of its own, which the run overrides).
"""

from __future__ import annotations

import json
import os
import random
import re
import sys

import httpx
from openai import OpenAI

CALC = {"type": "function", "function": {
    "name": "calc", "description": "Evaluate an arithmetic expression of integers, + - and *.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                   "required": ["expression"]}}}
MAX_STEPS = 3


def calc(expression: str) -> str:
    if not re.fullmatch(r"[0-9+\-* ()]{1,64}", expression):
        return "error: only integers, + - * and parentheses"
    return f"={eval(expression, {'__builtins__': {}})}\n"  # noqa: S307 - the pattern above admits arithmetic only


def _rewritten(messages: list[dict], how: str) -> list[dict]:
    """The history ``how`` rewrites it before the last call: the question, then the last call and its result."""
    question, earlier, last = messages[0], messages[1:-2], messages[-2:]
    if how == "drop":
        return [question, *last]
    if how == "edit":
        return [{**question, "content": question["content"] + "Use calc.\n"}, *earlier, *last]
    if how == "summarise":
        results = " ".join(message["content"].strip() for message in earlier if message["role"] == "tool")
        return [question, {"role": "user", "content": f"Earlier results: {results}\n"}, *last]
    raise ValueError(f"no such rewrite: {how}")


def play(task: dict, client: OpenAI, model: str, *, rewrite: str | None = None, stream: bool = False) -> float:
    """One episode of ``task`` through ``client``; its reward. ``rewrite``: drop, edit or summarise (see above)."""
    rng = random.Random(task["seed"])
    a, b = rng.randint(1, 9), rng.randint(1, 9)
    # The built-in calculator's terse format (environments/builtin/calculator.py), which models trained
    # from scratch learn from its demonstrations: the question, the tool's `=value`, an answer `A:value`.
    messages = [{"role": "user", "content": f"{a}+{b}=?\n"}]
    answer = ""
    for step in range(MAX_STEPS):
        sent = _rewritten(messages, rewrite) if rewrite and step == MAX_STEPS - 1 and len(messages) > 3 else messages
        if stream:
            calls: dict[int, dict] = {}
            content = ""
            for chunk in client.chat.completions.create(model=model, messages=sent, tools=[CALC], stream=True,
                                                        temperature=0.5):
                delta = chunk.choices[0].delta
                content += delta.content or ""
                for call in delta.tool_calls or ():
                    entry = calls.setdefault(call.index, {"id": call.id, "name": "", "arguments": ""})
                    entry["name"] += call.function.name or ""
                    entry["arguments"] += call.function.arguments or ""
            tool_calls = [{"id": call["id"], "type": "function",
                           "function": {"name": call["name"], "arguments": call["arguments"]}}
                          for _, call in sorted(calls.items())]
        else:
            reply = client.chat.completions.create(model=model, messages=sent, tools=[CALC], max_tokens=4000)
            message = reply.choices[0].message
            content = message.content or ""
            tool_calls = [call.model_dump() for call in message.tool_calls or ()]
        if not tool_calls:
            answer = content
            break
        messages = [*sent, {"role": "assistant", "content": content or None, "tool_calls": tool_calls}]
        for call in tool_calls:
            try:
                expression = json.loads(call["function"]["arguments"]).get("expression", "")
            except ValueError:
                expression = ""
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": calc(str(expression))})
    return 1.0 if str(a + b) in answer else 0.0


def main() -> int:
    client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    rewrite = next((argument.partition("=")[2] or "drop" for argument in sys.argv[1:]
                    if argument.startswith("--rewrite")), None)
    reward = play(json.loads(os.environ["TANDEM_TASK"]), client, os.environ.get("TANDEM_MODEL", "policy"),
                  rewrite=rewrite, stream="--stream" in sys.argv)
    # The reward call: the episode's endpoint, with its key, as any HTTP client would send it.
    httpx.post(f"{client.base_url}reward", json={"reward": reward},
               headers={"Authorization": f"Bearer {client.api_key}"}, timeout=30).raise_for_status()
    return 0


if __name__ == "__main__":
    sys.exit(main())
