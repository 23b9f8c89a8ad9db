"""Demonstrations of remote HTTP environments (``GET /demonstrations``), against the real example server."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from environments import demonstration_messages, http_example_server
from environments.adapters.http import RemoteHTTPEnvironment
from environments.builtin.calculator import CalculatorEnvironment
from tandem.configs.run import RunConfig
from tandem.contracts import (
    DemonstrationMessage,
    EnvironmentSpec,
    ProbeRequest,
    ProbeTimeouts,
    RunSpec,
    ToolSchema,
)
from workers.demonstrations import demonstration_batch
from workers.probe import run_probe

CALCULATOR_TOOLS = tuple(ToolSchema(name=tool.name, description=tool.description, parameters=tool.parameters)
                         for tool in CalculatorEnvironment().tools)


@pytest.fixture(scope="module")
def server_url():
    with http_example_server.running() as url:
        yield url


def _remote(url: str) -> EnvironmentSpec:
    return EnvironmentSpec(name="remote-calculator", kind="http",
                           entrypoint="environments.adapters.http:RemoteHTTPEnvironment",
                           settings={"url": url}, tools=CALCULATOR_TOOLS)


def _demonstrations(url: str, count: int, seed: int):
    async def fetch():
        environment = RemoteHTTPEnvironment(url=url)
        try:
            return await environment.demonstrations(count, random.Random(seed)), environment.tools
        finally:
            await environment.close()

    return asyncio.run(fetch())


def test_the_http_adapter_fetches_the_servers_demonstrations_seeded_from_the_rng(server_url):
    demonstrations, tools = _demonstrations(server_url, 6, seed=7)

    server_seed = random.Random(7).randrange(2**31)
    assert demonstrations == CalculatorEnvironment().demonstrations(6, random.Random(server_seed))
    assert demonstrations == _demonstrations(server_url, 6, seed=7)[0]  # a resumed run's step sees the same
    assert [tool.name for tool in tools] == ["calc"]  # read from /schema, to rewrite their tool calls


def test_a_server_that_does_not_advertise_demonstrations_is_not_asked_and_has_none(server_url):
    demonstrations, _ = _demonstrations(f"{server_url}/faults/minimal", 4, seed=1)

    assert demonstrations == []
    requests = httpx.get(f"{server_url}/stats").json()["requests"]
    assert "GET /faults/minimal/demonstrations" not in requests


def test_an_sft_steps_demonstrations_come_from_the_remote_environment_in_the_models_format(server_url):
    spec = RunSpec(run_id=1, config=RunConfig(), environment=_remote(server_url))

    batch = demonstration_batch(spec, step=2, count=4, seed=99, tool_call_format="qwen", request_id="r-2")

    assert batch.error == "", batch.error
    local = CalculatorEnvironment()
    expected = [[DemonstrationMessage.model_validate(message)
                 for message in demonstration_messages(demonstration, local.tools, "qwen")]
                for demonstration in local.demonstrations(4, random.Random(random.Random(99).randrange(2**31)))]
    assert [list(messages) for messages in batch.messages] == expected
    assert any("<tool_call>" in message.content for messages in batch.messages for message in messages)


def test_the_probe_passes_a_servers_demonstrations_and_fails_malformed_ones_in_that_check(server_url):
    timeouts = ProbeTimeouts(reset=5, step=5, demonstrations=5, close=5)
    good = run_probe(ProbeRequest(probe_id=1, purpose="registration", environment=_remote(server_url),
                                  timeouts=timeouts))
    bad = run_probe(ProbeRequest(probe_id=2, purpose="registration",
                                 environment=_remote(f"{server_url}/faults/bad-demonstrations"), timeouts=timeouts))

    checks = {check.name: check for check in good.checks}
    assert good.passed and checks["demonstrations"].message.startswith("2 demonstrations of "), good.checks
    statuses = {check.name: check.status for check in bad.checks}
    assert [name for name, status in statuses.items() if status != "passed"] == ["demonstrations"]
    message = next(check.message for check in bad.checks if check.name == "demonstrations")
    assert message.startswith("RemoteEnvironmentError: GET /demonstrations demonstrations[0] turns[")
    assert "'role' is 'narrator', expected policy or environment" in message
