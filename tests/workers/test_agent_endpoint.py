"""Issue 32, points 1 to 3: an agent program written against the ``openai`` client alone
(tests/agents/openai_react_agent.py, run as a subprocess like any operator-listed agent) plays episodes
through the producer's per-episode endpoint, and the trajectory is built from the endpoint's own token
records. SmolLM2's real tokenizer and chat template (Hermes tool calls); a scripted policy says the turns,
so the tokens each call must produce are known exactly."""

from __future__ import annotations

import asyncio
import json
import random
import sys
from pathlib import Path

import httpx
import pytest

from environments import AgentProgramEnvironment, Tool, format_tool_call
from policy import ChatTemplateLayout, Completion, load_tokenizer
from tandem.configs.rollout import SamplingConfig
from tests.agents import react_agent_service
from workers.agent import EpisodeLimits, run_episode
from workers.agent_endpoint import AgentEndpointServer, AgentEpisode
from workers.circuit_breaker import CircuitBreakers

AGENT = str(Path(__file__).resolve().parents[1] / "agents" / "openai_react_agent.py")
SDK_AGENT = str(Path(__file__).resolve().parents[1] / "agents" / "agents_sdk_agent.py")
SEED = 7


class ScriptedTurns:
    """Says each scripted text, ended by the template's end-of-turn token, in place of the engine, and
    keeps every prompt it was given."""

    def __init__(self, tokenizer, layout, turns, *, sampling=None):
        self.tokenizer, self.layout, self.turns = tokenizer, layout, list(turns)
        self.sampling = sampling or SamplingConfig(temperature=1.0, max_new_tokens=64)
        self.prompts: list[list[int]] = []
        self.completions: list[list[int]] = []
        self.ended: set = set()

    async def generate(self, token_ids, *, session_id, extra_stop=()):
        self.prompts.append(list(token_ids))
        tokens = [*self.tokenizer.encode(self.turns.pop(0)), self.layout.end_of_turn_id]
        self.completions.append(tokens)
        return Completion(token_ids=tokens, logprobs=[-0.25] * len(tokens), finished=True, stop_reason="eos",
                          policy_version=3, last_policy_version=3)

    def end_session(self, session_id):
        self.ended.add(session_id)


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    return load_tokenizer(str(smollm2))


@pytest.fixture
def agents(monkeypatch):
    """The operator's agent programs: the ReAct agent, plainly, rewriting its history, streaming, and broken."""
    commands = {
        "react": [sys.executable, AGENT], "react-rewrite": [sys.executable, AGENT, "--rewrite"],
        "react-edit": [sys.executable, AGENT, "--rewrite=edit"],
        "react-summarise": [sys.executable, AGENT, "--rewrite=summarise"],
        "react-stream": [sys.executable, AGENT, "--stream"], "agents-sdk": [sys.executable, SDK_AGENT],
        "crashes": [sys.executable, "-c", "import sys; print('boom', file=sys.stderr); sys.exit(3)"],
        "silent": [sys.executable, "-c", "pass"],
        "hangs": [sys.executable, "-c", "import time; time.sleep(60)"],
    }
    monkeypatch.setenv("TANDEM_AGENT_COMMANDS", json.dumps(commands))


def _sum_of(seed: int) -> tuple[int, int]:
    rng = random.Random(seed)
    return rng.randint(1, 9), rng.randint(1, 9)


def _episode(tokenizer, command, turns, *, timeout_s=60.0, max_turns=6, sampling=None, url=None):
    layout = ChatTemplateLayout(tokenizer)
    policy = ScriptedTurns(tokenizer, layout, turns, sampling=sampling)
    environment = AgentProgramEnvironment(command=command, url=url, timeout_s=timeout_s)
    record = asyncio.run(run_episode(
        run_id=1, group_id="1-0", group_size=1, environment_name="react", environment=environment,
        task={"seed": SEED}, policy=policy, tokenizer=tokenizer, layout=layout,
        limits=EpisodeLimits(max_turns=max_turns, max_seq_len=4096, max_new_tokens=64, environment_timeout_s=5),
        circuit_breakers=CircuitBreakers()))
    return record, policy, layout


def _calc_tool() -> Tool:
    async def never(arguments):
        raise AssertionError("not run")
    return Tool("calc", "Evaluate an arithmetic expression of integers, + - and *.",
                {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
                never)


def _trained(record) -> list[int]:
    return [token for token, mask in zip(record.token_ids, record.loss_mask, strict=True) if mask]


def test_an_openai_client_agent_trains_token_exactly_through_its_endpoint(tokenizer, agents):
    a, b = _sum_of(SEED)
    call = format_tool_call("calc", {"expression": f"{a}+{b}"}, "hermes")
    record, policy, layout = _episode(tokenizer, "react", [call, f"The answer is {a + b}."])

    assert record.status == "ok", record.failure_reason
    assert record.reward == 1.0 and record.num_turns == 2 and record.policy_versions == [3, 3]
    # One chain: the second call's prompt is the first's, its answer as sampled, and the tool's result.
    assert record.segment_starts == (0,)
    first, second = policy.prompts
    assert second[:len(first) + len(policy.completions[0])] == first + policy.completions[0]
    assert record.token_ids == second + policy.completions[1]
    # The first prompt is the user's message with the tool, rendered as Tandem renders its own episodes.
    assert first == layout.start(f"{a}+{b}=?\n", [_calc_tool()]).token_ids
    # Exactly the sampled tokens are trained, with the log-probs they were sampled with; nothing else.
    assert _trained(record) == policy.completions[0] + policy.completions[1]
    assert [lp for lp, mask in zip(record.behaviour_logprobs, record.loss_mask, strict=True) if mask] == \
        [-0.25] * sum(map(len, policy.completions))
    assert all(lp == 0.0 for lp, mask in zip(record.behaviour_logprobs, record.loss_mask, strict=True) if not mask)
    # The tool's result, which the agent ran itself, is in the context as a tool turn, masked.
    tool = [message for message in record.messages if message.role == "tool"]
    assert [message.content for message in tool] == [f"={a + b}\n"]
    assert not any(record.loss_mask[tool[0].start:tool[0].end])
    # Each call is on the record: tokens, the parsed call, how it finished.
    calls = record.agent_calls
    assert [(c.chain, c.prompt_tokens, c.completion_tokens) for c in calls] == \
        [(0, len(first), len(policy.completions[0])), (0, len(second), len(policy.completions[1]))]
    assert calls[0].finish_reason == "tool_calls" and calls[0].tool_calls[0].arguments == {"expression": f"{a}+{b}"}
    assert calls[1].finish_reason == "stop" and calls[1].content == f"The answer is {a + b}."
    assert calls[0].overrides == ("max_tokens: 4000 -> 64",) and not calls[0].streamed
    assert record.offered_tools == ("calc",)


def test_a_streamed_conversation_gives_the_same_tokens_and_records_the_overridden_temperature(tokenizer, agents):
    a, b = _sum_of(SEED)
    call = format_tool_call("calc", {"expression": f"{a}*1+{b}"}, "hermes")
    record, policy, _ = _episode(tokenizer, "react-stream", [f"Let me compute.\n{call}", f"{a + b}"],
                                 sampling=SamplingConfig(temperature=0.9, max_new_tokens=64))
    assert record.status == "ok" and record.reward == 1.0, record.failure_reason
    assert record.segment_starts == (0,) and _trained(record) == policy.completions[0] + policy.completions[1]
    assert all(c.streamed for c in record.agent_calls)
    assert record.agent_calls[0].overrides == ("temperature: 0.5 -> 0.9",)
    # The prose before the call came back to the agent as content, and the chain held.
    assert record.agent_calls[0].content.startswith("Let me compute.")


def test_an_openai_agents_sdk_program_plays_its_episode_through_the_endpoint(tokenizer, agents):
    a, b = _sum_of(SEED)
    call = format_tool_call("calc", {"expression": f"{a}+{b}"}, "hermes")
    record, policy, _ = _episode(tokenizer, "agents-sdk", [call, f"{a + b}"])
    assert record.status == "ok" and record.reward == 1.0, record.failure_reason
    # The SDK sent its instructions as a system message and extended the chain with the tool's result.
    assert record.messages[0].role == "system" and "Use calc" in record.messages[0].content
    assert record.segment_starts == (0,) and _trained(record) == policy.completions[0] + policy.completions[1]
    assert [c.finish_reason for c in record.agent_calls] == ["tool_calls", "stop"]


def test_an_agent_service_at_a_url_plays_its_episode_and_answers_with_the_reward(tokenizer):
    a, b = _sum_of(SEED)
    call = format_tool_call("calc", {"expression": f"{a}+{b}"}, "hermes")
    with react_agent_service.running() as url:
        record, policy, _ = _episode(tokenizer, None, [call, f"{a + b}"], url=url)
        wrong, _, _ = _episode(tokenizer, None, [call, "no idea"], url=url)
    assert record.status == "ok" and record.reward == 1.0, record.failure_reason
    assert _trained(record) == policy.completions[0] + policy.completions[1]
    assert wrong.status == "ok" and wrong.reward == 0.0


def test_a_rewritten_history_becomes_a_second_chain_sharing_the_reward(tokenizer, agents):
    a, b = _sum_of(SEED)
    calls = [format_tool_call("calc", {"expression": f"{a}+0"}, "hermes"),
             format_tool_call("calc", {"expression": f"{a}+{b}"}, "hermes")]
    record, policy, layout = _episode(tokenizer, "react-rewrite", [*calls, f"It is {a + b}"])

    assert record.status == "ok" and record.reward == 1.0, record.failure_reason
    assert [c.chain for c in record.agent_calls] == [0, 0, 1]
    chain_one_start = len(policy.prompts[1]) + len(policy.completions[1])
    assert record.segment_starts == (0, chain_one_start)
    # Chain 0: the first two calls, both trained.
    assert record.token_ids[:chain_one_start] == policy.prompts[1] + policy.completions[1]
    # Chain 1: the rewritten conversation (the user, the second answer given back, its tool result) as the
    # model was given it, then the last answer; the given-back answer keeps its sampled tokens, masked.
    assert record.token_ids[chain_one_start:] == policy.prompts[2] + policy.completions[2]
    assert _contains(policy.prompts[2], policy.completions[1])
    assert not _contains(policy.prompts[2], policy.completions[0])  # the dropped turn is gone
    assert _trained(record) == policy.completions[0] + policy.completions[1] + policy.completions[2]
    # The first chain's engine session ended when the second began.
    assert any(session.endswith(":0") for session in policy.ended)


@pytest.mark.parametrize("rewrite", ["edit", "summarise"])
def test_an_edited_or_summarised_history_becomes_a_second_chain_too(tokenizer, agents, rewrite):
    """Editing the question keeps both earlier answers, given back masked; a summary replaces the first answer
    and its result by a message of the agent's, and keeps the second answer."""
    a, b = _sum_of(SEED)
    calls = [format_tool_call("calc", {"expression": f"{a}+0"}, "hermes"),
             format_tool_call("calc", {"expression": f"{a}+{b}"}, "hermes")]
    record, policy, _ = _episode(tokenizer, f"react-{rewrite}", [*calls, f"It is {a + b}"])

    assert record.status == "ok" and record.reward == 1.0, record.failure_reason
    assert [c.chain for c in record.agent_calls] == [0, 0, 1]
    chain_one_start = len(policy.prompts[1]) + len(policy.completions[1])
    assert record.segment_starts == (0, chain_one_start)
    assert record.token_ids[chain_one_start:] == policy.prompts[2] + policy.completions[2]
    rewritten = tokenizer.decode(policy.prompts[2])
    assert _contains(policy.prompts[2], policy.completions[1])
    if rewrite == "edit":
        assert "Use calc." in rewritten and _contains(policy.prompts[2], policy.completions[0])
    else:
        assert f"Earlier results: ={a}" in rewritten and not _contains(policy.prompts[2], policy.completions[0])
    # Only the model's own answers are trained, each once: given back, they are masked.
    assert _trained(record) == policy.completions[0] + policy.completions[1] + policy.completions[2]
    replayed = [message for message in record.messages if message.replayed]
    assert len(replayed) == (2 if rewrite == "edit" else 1)


def _contains(haystack: list[int], needle: list[int]) -> bool:
    return any(haystack[i:i + len(needle)] == needle for i in range(len(haystack) - len(needle) + 1))


@pytest.mark.parametrize(("command", "reason"), [
    ("crashes", "exited with status 3: boom"),
    ("silent", "ended without calling its endpoint"),
    ("hangs", "did not finish within timeout_s=2s"),
])
def test_an_agent_that_fails_fails_its_episode_with_the_reason(tokenizer, agents, command, reason):
    record, _, _ = _episode(tokenizer, command, ["never said"], timeout_s=2)
    assert record.status == "failed" and reason in record.failure_reason
    assert not any(record.loss_mask)


def test_a_failure_of_the_endpoint_fails_the_episode_as_tandems_not_the_agents(tokenizer, agents):
    class Broken(ScriptedTurns):
        async def generate(self, token_ids, *, session_id, extra_stop=()):
            raise RuntimeError("the engine is gone")

    layout = ChatTemplateLayout(tokenizer)
    breakers = CircuitBreakers(failure_threshold=1)
    record = asyncio.run(run_episode(
        run_id=1, group_id="1-0", group_size=1, environment_name="react",
        environment=AgentProgramEnvironment(command="react", timeout_s=60), task={"seed": SEED},
        policy=Broken(tokenizer, layout, []), tokenizer=tokenizer, layout=layout,
        limits=EpisodeLimits(max_turns=4, max_seq_len=4096, max_new_tokens=64, environment_timeout_s=5),
        circuit_breakers=breakers))
    assert record.status == "failed"
    assert record.failure_reason == "the endpoint failed: generation failed: RuntimeError: the engine is gone"
    # Not the agent's fault: its circuit breaker, which one fault would open, stays closed.
    assert breakers.admit("react") is None


def test_an_agent_that_reports_no_reward_fails_its_episode(tokenizer, agents, monkeypatch):
    monkeypatch.setenv("TANDEM_AGENT_COMMANDS", json.dumps({"react": [
        sys.executable, "-c", "from openai import OpenAI; OpenAI().chat.completions.create(model='m', "
        "messages=[{'role': 'user', 'content': 'hi'}])"]}))
    record, _, _ = _episode(tokenizer, "react", ["hello"])
    assert record.status == "failed" and "reported no reward" in record.failure_reason


def test_the_key_is_refused_once_the_episode_ends_and_so_is_a_client_outside_the_allowed_networks(tokenizer):
    layout = ChatTemplateLayout(tokenizer)

    async def scenario():
        server = AgentEndpointServer(port=0)
        await server.start()
        episode = AgentEpisode(policy=ScriptedTurns(tokenizer, layout, ["hi", "again"]), layout=layout,
                               tokenizer=tokenizer, max_seq_len=2048, max_calls=4, model="m")
        access = server.open(episode)
        body = {"model": "m", "messages": [{"role": "user", "content": "hello"}]}
        async with httpx.AsyncClient() as client:
            url = f"{access.base_url}/chat/completions"
            wrong = await client.post(url, json=body, headers={"Authorization": "Bearer nope"})
            two = await client.post(url, json={**body, "n": 2}, headers={"Authorization": f"Bearer {access.api_key}"})
            good = await client.post(url, json=body, headers={"Authorization": f"Bearer {access.api_key}"})
            models = await client.get(f"{access.base_url}/models",
                                      headers={"Authorization": f"Bearer {access.api_key}"})
            server.close_episode(episode)
            after = await client.post(url, json=body, headers={"Authorization": f"Bearer {access.api_key}"})
        await server.close()

        fenced = AgentEndpointServer(port=0, clients="10.0.0.0/8")
        await fenced.start()
        other = AgentEpisode(policy=ScriptedTurns(tokenizer, layout, ["hi"]), layout=layout, tokenizer=tokenizer,
                             max_seq_len=2048, max_calls=4, model="m")
        fenced_access = fenced.open(other)
        async with httpx.AsyncClient() as client:
            outside = await client.post(f"{fenced_access.base_url}/chat/completions", json=body,
                                        headers={"Authorization": f"Bearer {fenced_access.api_key}"})
        await fenced.close()
        return wrong, two, good, models, after, outside

    wrong, two, good, models, after, outside = asyncio.run(scenario())
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
    assert two.status_code == 400 and two.json()["error"]["param"] == "n"
    assert good.status_code == 200 and good.json()["choices"][0]["message"]["content"] == "hi"
    assert models.json()["data"][0]["id"] == "m"
    assert after.status_code == 401
    assert outside.status_code == 403 and "TANDEM_AGENT_ENDPOINT_CLIENTS" in outside.json()["error"]["message"]


def _probe(command: str, tools=(), **settings):
    from tandem.contracts import EnvironmentSpec, ProbeRequest, ProbeTimeouts
    from workers.probe import run_probe

    spec = EnvironmentSpec(name="agent-probe", kind="agent", settings={"command": command, **settings}, tools=tools)
    report = run_probe(ProbeRequest(probe_id=1, purpose="registration", environment=spec,
                                    timeouts=ProbeTimeouts(url=5, load=10, reset=2, tools=2, step=2, close=2)))
    return report


def test_the_probe_runs_one_episode_of_the_agent_and_says_what_it_did(agents):
    report = _probe("react")
    assert report.passed and [check.name for check in report.checks] == ["url", "load", "sample_task", "agent"]
    agent = report.checks[-1]
    # The probe has no model: every answer is empty, so the agent answers at once and reports 0.
    assert agent.status == "passed", agent.message
    assert agent.message == ("the agent called its endpoint 1 time(s); its prefixes held (one chain); "
                             "it reported a reward of 0")


def test_declared_tools_must_be_those_the_agent_offers(agents):
    calc = _calc_tool()
    declared = [{"name": calc.name, "description": calc.description, "parameters": calc.parameters}]
    assert _probe("react", tools=declared).passed
    other = [{**declared[0], "name": "calculate"}]
    check = _probe("react", tools=other).checks[-1]
    assert check.status == "failed" and "not the declared calculate; declare what it offers" in check.message


def test_the_probe_fails_an_agent_that_never_calls_its_endpoint_or_is_not_listed(agents):
    silent = _probe("silent")
    assert not silent.passed and silent.checks[-1].name == "agent"
    assert silent.checks[-1].status == "failed" and "ended without calling its endpoint" in silent.checks[-1].message
    unlisted = {check.name: check for check in _probe("rm-rf").checks}["load"]
    assert unlisted.status == "failed" and "TANDEM_AGENT_COMMANDS" in unlisted.message


def test_a_call_past_max_seq_len_is_refused_changes_nothing_and_truncates_the_episode(tokenizer):
    from workers.agent_endpoint import ChatCompletionRequest, EndpointError

    layout = ChatTemplateLayout(tokenizer)
    policy = ScriptedTurns(tokenizer, layout, ["Hello there."], sampling=SamplingConfig(max_new_tokens=16))
    user = {"role": "user", "content": "hi"}
    probe = layout.start("hi", ())
    # Room for the opening and one answer, not for a long tool result after it.
    episode = AgentEpisode(policy=policy, layout=layout, tokenizer=tokenizer, max_seq_len=len(probe) + 40,
                           max_calls=4, model="m")

    async def scenario():
        first = await episode.complete(ChatCompletionRequest.model_validate({"messages": [user]}))
        answer = first["choices"][0]["message"]
        long = {"role": "user", "content": "word " * 200}
        outcomes = []
        for _ in range(2):  # the agent retries as it was: the same refusal, nothing appended
            with pytest.raises(EndpointError) as refused:
                await episode.complete(ChatCompletionRequest.model_validate({"messages": [user, answer, long]}))
            outcomes.append((refused.value.code, len(episode._chains[0].tokens), len(episode._chains)))
        return outcomes

    outcomes = asyncio.run(scenario())
    length = len(policy.prompts[0]) + len(policy.completions[0])
    assert outcomes == [("context_length_exceeded", length, 1)] * 2
    played = episode.finish()
    assert played.truncated_because.startswith("the agent's call 2 leaves no room for an answer")
    assert len(played.tokens) == length and len(played.calls) == 1
