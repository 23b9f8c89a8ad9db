"""Issue 32, point 4, on a whole stack: an environment whose tools come from a real MCP server.

Registered through REST with ``tool_server`` (the suite's TANDEM_MCP_SERVERS lists
tests/workers/mcp_arithmetic_server.py, as an operator would, and the stack's processes inherit it),
its probe starts the server on the probe worker and checks the listed tools against the declaration;
a run's producers start it for every episode and offer its tools, so each RL step reports the
environment's tool metrics, and no episode fails.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import registration_probed, run_ended, user_api
from tests.workers.test_mcp_tools import served_tool_schemas

NAME = "sums-mcp"
RL_STEPS = 2


@pytest.mark.timeout(900)  # above its inner waits (tests/test_timeouts.py)
def test_a_run_offers_the_tools_of_an_mcp_server_started_per_episode(stack, credentials):
    local, _ = stack
    api = user_api(local, credentials)
    registered = api.post("/api/environments/", json={
        "project": credentials.project_id, "name": NAME, "kind": "python",
        "entrypoint": "tests.workers.mcp_task:SumTask", "tool_server": {"command": "arithmetic"},
        "tools": [tool.model_dump() for tool in served_tool_schemas()]})
    assert registered.status_code == 201, registered.text
    version, probe = registration_probed(local, api, registered.json()["id"])
    assert version["status"] == "ready", (version["status_reason"], version["probes"])
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
