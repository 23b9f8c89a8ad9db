"""A run on an environment whose name has the registry's maximum length keeps every step's metrics.

Before, only step 1's were stored for a name of 49 characters: ``idle/<env>/...`` and
``producers/circuit_open/<env>`` passed the platform's 64 characters, the platform refused each
post whole, and the trainer dropped it; an evaluation of such an environment was refused too.
"""

from __future__ import annotations

import pytest

from tandem.contracts import (
    METRIC_NAME_LENGTH_MAX,
    SERIES_REFUSED_METRIC,
    circuit_open_metric_name,
    metric_series_name,
)
from tests.e2e.conftest import run_ended, user_api
from tests.polling import poll_until

NAME_LENGTH_MAX = 100  # environment_registry.models.Environment.name
TRAINED = "calculator-of-a-shared-team-" + "x" * (NAME_LENGTH_MAX - len("calculator-of-a-shared-team-"))
# Shares its first 90 characters with TRAINED: its series must still be apart.
EVALUATED = TRAINED[:90] + "-evaluated"
RL_STEPS = 4
# The calculator's tool, declared as the probe checks it (platform/environment_registry/builtin.py).
CALCULATOR_TOOL = {
    "name": "calc", "description": "Evaluates an integer arithmetic expression with + - * and parentheses.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "e.g. 37*58",
                                                                    "examples": ["37*58"]}},
                   "required": ["expression"]},
}


def _register(api, project_id: int, name: str) -> None:
    registered = api.post("/api/environments/", json={
        "project": project_id, "name": name, "kind": "python",
        "entrypoint": "environments.builtin.calculator:CalculatorEnvironment", "tools": [CALCULATOR_TOOL]})
    assert registered.status_code == 201, registered.text
    environment_id = registered.json()["id"]
    poll_until(lambda: api.get(f"/api/environments/{environment_id}/").json()["latest_version"]["status"]
               == "ready", timeout_s=120, interval_s=0.5,
               what=lambda: f"the probe of {name[:20]}... to pass: {api.get(f'/api/environments/{environment_id}/').text}")


def _points(api, run_id: int) -> dict[int, dict[str, float]]:
    """Every stored point of the run, step -> name -> value, page by page."""
    by_step: dict[int, dict[str, float]] = {}
    after_step = -1
    while True:
        page = api.get(f"/api/runs/{run_id}/metrics/", params={"after_step": after_step, "limit": 5000}).json()
        for point in page["points"]:
            by_step.setdefault(point["step"], {})[point["name"]] = point["value"]
        if not page["points"] or page["next_after_step"] is None:
            return by_step
        after_step = page["next_after_step"]


@pytest.mark.timeout(900)  # above its inner waits (tests/test_timeouts.py)
def test_a_run_on_an_environment_of_the_longest_name_keeps_every_steps_metrics(stack, credentials):
    local, _ = stack
    api = user_api(local, credentials)
    assert len(TRAINED) == len(EVALUATED) == NAME_LENGTH_MAX
    for name in (TRAINED, EVALUATED):
        _register(api, credentials.project_id, name)

    created = api.post("/api/runs/", json={
        "project": credentials.project_id, "name": "longest environment name", "environment": TRAINED,
        "config": {"sft_steps": 0, "rl_steps": RL_STEPS,
                   "rollout": {"group_size": 2, "groups_per_step": 2, "groups_per_task": 1},
                   "evaluation": {"tasks": 2, "samples_per_task": 1, "pass_k": [1], "every_steps": 2,
                                  "environments": [EVALUATED]}}})
    assert created.status_code == 201, created.text
    run = run_ended(local, api, created.json()["id"], timeout_s=600)
    assert run["status"] == "finished", run["status_reason"]

    points = _points(api, run["id"])
    trained_label = TRAINED  # trajectories name their environment without its version
    for step in range(1, RL_STEPS + 1):
        names = points.get(step, {})
        assert {"loss", "wall_s", "trainer_idle_fraction"} <= set(names), (step, sorted(names))
        assert metric_series_name("rollout", trained_label, "error_rate") in names, (
            step, sorted(name for name in names if name.startswith(("rollout/", "idle/", "producers/"))))
        assert SERIES_REFUSED_METRIC not in names, (step, sorted(names))
    every_name = {name for names in points.values() for name in names}
    assert max(len(name) for name in every_name) <= METRIC_NAME_LENGTH_MAX
    # The per-environment series a long name used to break: the breaker's count, and the idle causes.
    assert circuit_open_metric_name(trained_label) in every_name
    idle_prefix = metric_series_name("idle", trained_label, "").rstrip("/") + "/"
    assert any(name.startswith(idle_prefix) for name in every_name), sorted(every_name)

    evaluations = api.get(f"/api/runs/{run['id']}/evaluations/").json()["results"]
    elsewhere = [evaluation for evaluation in evaluations if evaluation["environment"] == f"{EVALUATED}@1"]
    assert elsewhere and all(evaluation["status"] == "complete" for evaluation in elsewhere), evaluations
    for evaluation in elsewhere:
        series = metric_series_name("eval", f"{EVALUATED}@1", "success_rate")
        assert evaluation["series_label"] == series.split("/")[1]
        assert points[evaluation["step"]][series] == evaluation["metrics"]["success_rate"]
    # The two names share 90 characters, yet their series stay apart.
    assert metric_series_name("eval", f"{EVALUATED}@1", "x") != metric_series_name("eval", trained_label, "x")
