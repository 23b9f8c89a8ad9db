"""Issue 32, point 4, on a whole stack: an environment whose tools come from a real MCP server.

Registered through REST with ``tool_server`` (the suite's TANDEM_MCP_SERVERS lists
tests/workers/mcp_arithmetic_server.py, as an operator would, and the stack's processes inherit it),
its probe starts the server on the probe worker and checks the listed tools against the declaration;
a run's producers start it for every episode and offer its tools, so each RL step reports the
environment's tool metrics, and no episode fails.
"""

from __future__ import annotations

import asyncio

import pytest

from environments import load_environment_class
from tandem.contracts import EnvironmentSpec
from tests.e2e.conftest import run_ended, user_api
from tests.polling import poll_until

NAME = "sums-mcp"
RL_STEPS = 2


def _served_tools() -> list[dict]:
    """The server's tools as it lists them: what a registration declares."""
    spec = EnvironmentSpec(name=NAME, kind="python", entrypoint="tests.workers.mcp_task:SumTask",
                           tool_server={"command": "arithmetic"})
    environment = load_environment_class(spec)()

    async def listed():
        await environment.reset({"a": 1, "b": 2})
        await environment.close()
        return environment.tools

    return [{"name": tool.name, "description": tool.description, "parameters": tool.parameters}
            for tool in asyncio.run(listed())]


@pytest.mark.timeout(900)  # above its inner waits (tests/test_timeouts.py)
def test_a_run_offers_the_tools_of_an_mcp_server_started_per_episode(stack, credentials):
    local, _ = stack
    api = user_api(local, credentials)
    registered = api.post("/api/environments/", json={
        "project": credentials.project_id, "name": NAME, "kind": "python",
        "entrypoint": "tests.workers.mcp_task:SumTask", "tool_server": {"command": "arithmetic"},
        "tools": _served_tools()})
    assert registered.status_code == 201, registered.text
    environment_id = registered.json()["id"]

    def probed() -> dict | None:
        version = api.get(f"/api/environments/{environment_id}/versions/1/").json()
        return version if version["status"] != "pending" else None

    version = poll_until(probed, timeout_s=120, interval_s=1.0, between=local.check_alive,
                         what="the MCP environment's registration probe")
    assert version["status"] == "ready", (version["status_reason"], version["probes"])
    [probe] = [probe for probe in version["probes"] if probe["purpose"] == "registration"]
    assert {check["name"]: check["status"] for check in probe["checks"]}["tools"] == "passed"

    created = api.post("/api/runs/", json={
        "project": credentials.project_id, "name": "mcp tools", "environment": NAME,
        "config": {"sft_steps": 0, "rl_steps": RL_STEPS, "rollout": {"group_size": 2, "groups_per_step": 2,
                                                                     "groups_per_task": 1, "max_turns": 2}}})
    assert created.status_code == 201, created.text
    run = run_ended(local, api, created.json()["id"], timeout_s=600)
    assert run["status"] == "finished", run["status_reason"]

    prefix = f"rollout/{NAME}/"
    names = [f"{prefix}tool_call_rate", f"{prefix}error_rate"]
    points = api.get(f"/api/runs/{run['id']}/metrics/", params={"names": ",".join(names)}).json()["points"]
    by_name = {name: [point for point in points if point["name"] == name] for name in names}
    # Episodes were offered the server's tools (the tool series exist only then), and none failed.
    assert [point["step"] for point in by_name[f"{prefix}tool_call_rate"]] == list(range(1, RL_STEPS + 1))
    assert [point["value"] for point in by_name[f"{prefix}error_rate"]] == [0.0] * RL_STEPS
