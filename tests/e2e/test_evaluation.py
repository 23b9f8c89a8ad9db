"""Held-out evaluation during a whole run: before RL, every so many steps, at the end; never trained on."""

from __future__ import annotations

import redis

from tandem.contracts import EVALUATION_METRICS, LineageEntry, lineage_stream
from tests.e2e.conftest import run_ended, user_api

SFT_STEPS = 20
RL_STEPS = 4
EVALUATION = {"every_steps": 2, "tasks": 4, "samples_per_task": 2, "pass_k": [1, 2], "temperature": 0}


def test_a_run_evaluates_held_out_tasks_beside_training_and_never_trains_on_them(stack, credentials,
                                                                                e2e_redis_url):
    local, _ = stack
    api = user_api(local, credentials)
    created = api.post("/api/runs/", json={"project": credentials.project_id, "name": "evaluated",
                                           "environment": "calculator", "config": {
        "sft_steps": SFT_STEPS, "rl_steps": RL_STEPS, "evaluation": EVALUATION}})
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]
    run = run_ended(local, api, run_id, timeout_s=600)
    assert run["status"] == "finished", run["status_reason"]

    evaluations = api.get(f"/api/runs/{run_id}/evaluations/").json()
    evaluations = evaluations["results"] if isinstance(evaluations, dict) else evaluations
    # Before the first RL step (the SFT policy), after RL step 2, and at the end.
    assert [(e["index"], e["step"]) for e in evaluations] == [
        (0, SFT_STEPS), (1, SFT_STEPS + 2), (2, SFT_STEPS + RL_STEPS)]
    versions = [e["policy_version"] for e in evaluations]
    assert versions == sorted(versions) and len(set(versions)) == 3
    for evaluation in evaluations:
        assert evaluation["status"] == "complete", evaluation["reason"]
        assert evaluation["episodes"] == 8 and evaluation["environment"].startswith("calculator@")
        assert set(EVALUATION_METRICS) | {"pass@1", "pass@2", "avg@1", "avg@2"} <= set(evaluation["metrics"])
        assert evaluation["metrics"]["pass@2"] >= evaluation["metrics"]["pass@1"]
        assert len(evaluation["trajectory_ids"]) == 8

    # Charted apart from the training reward, at the evaluations' steps.
    points = api.get(f"/api/runs/{run_id}/metrics/",
                     params={"after_step": -1, "names": "eval/success_rate"}).json()["points"]
    assert sorted(point["step"] for point in points) == [SFT_STEPS, SFT_STEPS + 2, SFT_STEPS + RL_STEPS]

    # No evaluation episode was ever trained on.
    client = redis.Redis.from_url(e2e_redis_url)
    lineage = [LineageEntry.from_stream_fields(fields) for _, fields in client.xrange(lineage_stream(run_id))]
    trained = {trajectory for entry in lineage if entry.kind == "trained" for trajectory in entry.trajectory_ids}
    assert len(trained) == RL_STEPS * 32
    evaluated = {trajectory for evaluation in evaluations for trajectory in evaluation["trajectory_ids"]}
    assert len(evaluated) == 24 and not trained & evaluated
