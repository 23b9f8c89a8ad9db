"""Issue 32, point 5, on a whole stack: an agent written only against the ``openai`` client
(tests/agents/openai_react_agent.py; the suite's TANDEM_AGENT_COMMANDS lists it, as an operator would, and
the stack's processes inherit it) is registered through REST as an ``agent`` environment, probed, and
trained by GRPO through the per-episode endpoint of real Celery producers, with the real trainer. Every
episode's trajectory comes from the endpoint's token records: the trainer trains exactly the policy's
turns, and the trajectory browser shows them as such."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import registration_probed, run_ended, user_api

NAME = "react-agent"
RL_STEPS = 2


@pytest.mark.timeout(900)  # above its inner waits (tests/test_timeouts.py)
def test_an_openai_client_agent_trains_through_its_endpoint(stack, credentials):
    local, _ = stack
    api = user_api(local, credentials)
    registered = api.post("/api/environments/", json={
        "project": credentials.project_id, "name": NAME, "kind": "agent",
        "settings": {"command": "react-calculator", "timeout_s": 120}})
    assert registered.status_code == 201, registered.text
    version, probe = registration_probed(local, api, registered.json()["id"])
    assert version["status"] == "ready", (version["status_reason"], probe["checks"])
    agent_check = {check["name"]: check for check in probe["checks"]}["agent"]
    assert agent_check["status"] == "passed" and "called its endpoint 1 time(s)" in agent_check["message"]

    created = api.post("/api/runs/", json={
        "project": credentials.project_id, "name": "openai agent", "environment": NAME,
        "config": {"sft_steps": 0, "rl_steps": RL_STEPS, "rollout": {"group_size": 2, "groups_per_step": 2,
                                                                     "groups_per_task": 1, "max_turns": 3},
                   # Held-out episodes of the agent too, greedy: their samples share turns (workers/evaluation.py).
                   "evaluation": {"every_steps": 100, "tasks": 3, "samples_per_task": 2, "temperature": 0}}})
    assert created.status_code == 201, created.text
    run = run_ended(local, api, created.json()["id"], timeout_s=600)
    assert run["status"] == "finished", run["status_reason"]

    # No episode failed: each agent ran, called its endpoint and reported a reward.
    name = f"rollout/{NAME}/error_rate"
    points = api.get(f"/api/runs/{run['id']}/metrics/", params={"names": name}).json()["points"]
    by_step = {point["step"]: point["value"] for point in points}
    assert set(range(1, RL_STEPS + 1)) <= set(by_step) and set(by_step.values()) == {0.0}, points

    # Its held-out evaluations, before RL and at the end, ran every episode through the agent.
    evaluations = api.get(f"/api/runs/{run['id']}/evaluations/").json()["results"]
    assert [evaluation["step"] for evaluation in evaluations] == [0, RL_STEPS]
    for evaluation in evaluations:
        assert evaluation["status"] == "complete" and evaluation["episodes"] == 6, evaluation
        assert evaluation["metrics"]["failure_rate"] == 0.0, evaluation

    # What the trainer trained: the policy's turns exactly, never the agent's messages.
    samples = api.get(f"/api/runs/{run['id']}/trajectories/",
                      params={"page_size": 200, "purpose": "training"}).json()["results"]
    assert {sample["step"] for sample in samples} == set(range(1, RL_STEPS + 1))
    assert all(sample["environment"] == NAME and sample["status"] != "failed" for sample in samples)
    for sample in samples:
        detail = api.get(sample["url"]).json()
        assert detail["turns"][0]["role"] == "prompt" and detail["turns"][1]["role"] == "policy"
        for turn in detail["turns"]:
            assert all(span["trained"] == (turn["role"] == "policy") for span in turn["spans"]), turn
        trained = sum(span["tokens"] for turn in detail["turns"] for span in turn["spans"] if span["trained"])
        assert trained == detail["trained_tokens"] > 0
        # One policy turn per call of the agent, each on the policy version it was sampled with.
        assert len(detail["policy_versions"]) == detail["num_turns"] == \
            sum(turn["role"] == "policy" for turn in detail["turns"]) >= 1
