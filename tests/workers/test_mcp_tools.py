"""Issue 32, point 4: an environment takes its tools from a real MCP server (tests/workers/mcp_arithmetic_server.py,
over stdio or streamable HTTP), started per episode from the operator's list, through the real agent loop and the real probe."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from environments import EnvironmentLoadError, ToolError, format_tool_call, load_environment_class
from environments.mcp_tools import McpServerError
from policy import ByteLayout, ByteTokenizer
from tandem.allowlists.mcp_servers import configured_mcp_servers
from tandem.contracts import EnvironmentSpec, ProbeRequest, ProbeTimeouts, ToolSchema
from tests.polling import poll_until
from workers.agent import EpisodeLimits, run_episode
from workers.circuit_breaker import CircuitBreakers
from workers.probe import run_probe

from .test_tool_call_feedback import ScriptedTurns

SERVER = Path(__file__).with_name("mcp_arithmetic_server.py")
# Starting a Python MCP server (its imports) takes a second or two.
TIMEOUTS = ProbeTimeouts(url=5, load=10, reset=30, tools=5, step=5, close=30)


@pytest.fixture(autouse=True)
def operator_servers(monkeypatch):
    monkeypatch.setenv("TANDEM_MCP_SERVERS", json.dumps({"arithmetic": [sys.executable, str(SERVER)]}))


def _spec(server: str = "arithmetic", *, tools: tuple[ToolSchema, ...] = (), url: str | None = None) -> EnvironmentSpec:
    return EnvironmentSpec(name="sums", kind="python", entrypoint="tests.workers.mcp_task:SumTask",
                           tool_server={"url": url} if url else {"command": server}, tools=tools)


@pytest.fixture(scope="module")
def http_server_url():
    """The suite's server over streamable HTTP on a free loopback port, for the module's tests."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, str(SERVER), "--http", str(port)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    def listening() -> bool:
        with socket.socket() as attempt:
            return attempt.connect_ex(("127.0.0.1", port)) == 0

    def alive() -> None:
        if process.poll() is not None:
            raise RuntimeError(f"the MCP server ended with {process.returncode} before it listened")

    try:
        poll_until(listening, timeout_s=30, between=alive, what=f"the MCP server to listen on port {port}")
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=30)


def _tool(environment, name):
    return next(tool for tool in environment.tools if tool.name == name)


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_each_episode_opens_a_session_lists_its_tools_and_ends_it_at_close(transport, request):
    url = request.getfixturevalue("http_server_url") if transport == "http" else None
    environment = load_environment_class(_spec(url=url))()

    async def episode() -> tuple[list[str], str]:
        await environment.reset({"a": 2, "b": 3})
        answers = [await _tool(environment, "add").run({"a": 2, "b": 3}),
                   await _tool(environment, "count").run({}), await _tool(environment, "count").run({})]
        session = await _tool(environment, "session").run({})
        with pytest.raises(ToolError, match="Error executing tool refuse"):
            await _tool(environment, "refuse").run({"reason": "no"})
        await environment.close()
        with pytest.raises(ToolError, match="is not running"):  # its session has ended
            await _tool(environment, "add").run({"a": 1, "b": 1})
        return answers, session

    assert environment.tools == ()  # none before the episode's session is opened
    first, first_session = asyncio.run(episode())
    assert [tool.name for tool in environment.tools] == ["add", "refuse", "count", "session"]
    assert _tool(environment, "add").parameters["required"] == ["a", "b"]
    second, second_session = asyncio.run(episode())
    # The server counts per session, as a stateful server keeps state: the next episode starts from scratch.
    assert first == second == ["5", "1", "2"]
    if transport == "http":
        # Each episode had a session of its own, and its end terminated it: the server no longer knows it.
        assert first_session and second_session and first_session != second_session
        for ended in (first_session, second_session):
            answer = httpx.post(url, headers={"mcp-session-id": ended, "mcp-protocol-version": "2025-11-25",
                                              "accept": "application/json, text/event-stream"},
                                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
            assert answer.status_code == 404, answer.text


def test_a_url_is_checked_where_the_connection_is_made(http_server_url, monkeypatch):
    """A name that passes the check as written is refused at connect time when it resolves outside the
    allow-list (as a rebinding DNS would make it), and the episode's reset says why."""
    monkeypatch.setenv("TANDEM_ENVIRONMENT_URL_ALLOWLIST", "10.0.0.0/8")
    environment = load_environment_class(_spec(url=http_server_url.replace("127.0.0.1", "localhost")))()

    with pytest.raises(McpServerError, match="did not start: localhost resolves to an address not on the environment URL allow-list"):
        asyncio.run(environment.reset({"a": 1, "b": 2}))
    with pytest.raises(EnvironmentLoadError, match="169.254.169.254"):
        load_environment_class(_spec(url="http://169.254.169.254:80/mcp"))


def test_a_server_the_operator_does_not_list_is_never_started():
    with pytest.raises(EnvironmentLoadError, match="'shell' is not one the operator allows.*TANDEM_MCP_SERVERS"):
        load_environment_class(_spec("shell"))


def test_an_episode_calls_the_servers_tool_and_a_refused_call_is_told_to_the_model():
    tokenizer = ByteTokenizer()
    # Hermes blocks: the byte layout's own format takes one string argument, and add takes two integers.
    layout = ByteLayout(tokenizer, tool_call_format="hermes")
    environment = load_environment_class(_spec())()
    turns = [format_tool_call("refuse", {"reason": "not today"}, "hermes"),
             format_tool_call("add", {"a": 417, "b": 389}, "hermes"), "806"]
    record = asyncio.run(run_episode(
        run_id=1, group_id="1-0", group_size=1, environment_name="sums", environment=environment,
        task={"a": 417, "b": 389}, policy=ScriptedTurns(tokenizer, layout, turns), tokenizer=tokenizer,
        layout=layout, limits=EpisodeLimits(max_turns=4, max_seq_len=4096, max_new_tokens=64,
                                            environment_timeout_s=30),
        circuit_breakers=CircuitBreakers()))

    assert record.status == "ok" and record.reward == 1.0, record.failure_reason
    assert record.offered_tools == ("add", "refuse", "count", "session")
    assistant = [message for message in record.messages if message.role == "assistant"]
    assert [message.tool_call_status for message in assistant] == ["tool_error", "ok", None]
    tool_results = [message.content for message in record.messages if message.role == "tool"]
    assert "Error executing tool refuse" in tool_results[0] and tool_results[1].strip().endswith("806")
    assert record.tool_calls_run() == 1


def served_tool_schemas() -> tuple[ToolSchema, ...]:
    """The tools the suite's server lists, through one episode of SumTask: what a registration declares."""
    environment = load_environment_class(_spec())()

    async def listed():
        await environment.reset({"a": 1, "b": 2})
        await environment.close()
        return environment.tools

    return tuple(ToolSchema(name=tool.name, description=tool.description, parameters=tool.parameters)
                 for tool in asyncio.run(listed()))


def test_the_probe_checks_the_servers_tools_against_the_declaration_and_calls_none():
    declared = served_tool_schemas()
    passed = run_probe(ProbeRequest(probe_id=1, purpose="registration", environment=_spec(tools=declared),
                                    timeouts=TIMEOUTS))
    assert {check.name: check.status for check in passed.checks}["tools"] == "passed", passed.checks

    undeclared = run_probe(ProbeRequest(probe_id=2, purpose="registration", environment=_spec(),
                                        timeouts=TIMEOUTS))
    tools = next(check for check in undeclared.checks if check.name == "tools")
    assert tools.status == "failed"
    assert "exposed but not declared (register them)" in tools.message and '"name": "add"' in tools.message


def test_the_probe_calls_the_tools_a_registration_asks_it_to_and_fails_on_an_error_answer():
    declared = served_tool_schemas()

    def probed(*calls):
        spec = EnvironmentSpec(name="sums", kind="python", entrypoint="tests.workers.mcp_task:SumTask",
                               tool_server={"command": "arithmetic", "probe_calls": calls}, tools=declared)
        report = run_probe(ProbeRequest(probe_id=1, purpose="registration", environment=spec, timeouts=TIMEOUTS))
        return {check.name: check for check in report.checks}, report

    checks, report = probed({"name": "add", "arguments": {"a": 2, "b": 40}}, {"name": "count"})
    assert report.passed and checks["tool_calls"].status == "passed", checks["tool_calls"]
    assert checks["tool_calls"].message == "add answered '42'; count answered '1'"
    refused, report = probed({"name": "refuse", "arguments": {"reason": "no"}})
    assert not report.passed and refused["tool_calls"].status == "failed"
    assert refused["tool_calls"].message.startswith('refuse({"reason": "no"}) answered an error:')
    # Without calls asked, the probe calls none: no such check.
    unasked = run_probe(ProbeRequest(probe_id=3, purpose="registration", environment=_spec(tools=declared),
                                     timeouts=TIMEOUTS))
    assert "tool_calls" not in {check.name for check in unasked.checks}


@pytest.mark.parametrize(("configured", "message"), [
    ("[1, 2]", "must be a JSON object"),
    ('{"calc": "python server.py"}', "must be a non-empty list of strings"),
    ('{"../x": ["python"]}', "is not a name"),
    ("{calc", "is not JSON"),
])
def test_a_malformed_operator_list_is_refused_with_its_setting_named(configured, message):
    with pytest.raises(ValueError, match=f"TANDEM_MCP_SERVERS.*{message}|{message}"):
        configured_mcp_servers(configured)
