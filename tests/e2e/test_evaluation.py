"""Held-out evaluation during a whole run (before RL, every so many steps, at the end; never trained on),
and an evaluation-only run of its final checkpoint that reproduces its final evaluation."""

from __future__ import annotations

import pytest
import redis

from tandem.contracts import EVALUATION_METRICS, LineageEntry, lineage_stream
from tests.e2e.conftest import run_ended, user_api
from tests.polling import poll_until

SFT_STEPS = 20
RL_STEPS = 4
EVALUATION = {"every_steps": 2, "tasks": 4, "samples_per_task": 2, "pass_k": [1, 2], "temperature": 0}


@pytest.mark.timeout(1500)  # above its inner waits (tests/test_timeouts.py)
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

    evaluations = api.get(f"/api/runs/{run_id}/evaluations/").json()["results"]
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

    # A few of each evaluation's episodes are in the trajectory browser, told apart from trained ones.
    def sampled(purpose: str) -> set[str]:
        body = api.get(f"/api/runs/{run_id}/trajectories/", params={"purpose": purpose, "page_size": 500}).json()
        return {row["id"] for row in body["results"]}

    evaluation_samples, training_samples = sampled("evaluation"), sampled("training")
    assert evaluation_samples and evaluation_samples <= evaluated
    assert training_samples and training_samples <= trained

    # An evaluation-only run of the final checkpoint reproduces the final in-training evaluation:
    # the same parameters, the same held-out tasks, greedy.
    checkpoints = api.get(f"/api/runs/{run_id}/checkpoints/").json()["results"]
    final_step = max(checkpoint["step"] for checkpoint in checkpoints)
    assert final_step == SFT_STEPS + RL_STEPS
    replay = api.post(f"/api/runs/{run_id}/evaluate/", json={"step": final_step})
    assert replay.status_code == 201, replay.text
    replay_run = replay.json()
    assert replay_run["config"]["start_from"] == {"run": run_id, "step": final_step}
    assert (replay_run["config"]["sft_steps"], replay_run["config"]["rl_steps"]) == (0, 0)
    ended = run_ended(local, api, replay_run["id"], timeout_s=600)
    assert ended["status"] == "finished", ended["status_reason"]
    (replayed,) = api.get(f"/api/runs/{replay_run['id']}/evaluations/").json()["results"]
    final = evaluations[-1]
    assert replayed["status"] == "complete" and replayed["episodes"] == final["episodes"]

    def without_cost(metrics: dict) -> dict:
        return {name: value for name, value in metrics.items() if name != "wall_s"}

    assert without_cost(replayed["metrics"]) == without_cost(final["metrics"])
    # The replay trained nothing.
    replay_lineage = client.xrange(lineage_stream(replay_run["id"]))
    assert not [fields for _, fields in replay_lineage
                if LineageEntry.from_stream_fields(fields).kind == "trained"]


def test_a_run_cannot_name_another_runs_checkpoint_itself(stack, credentials):
    local, _ = stack
    api = user_api(local, credentials)
    refused = api.post("/api/runs/", json={"project": credentials.project_id, "environment": "calculator",
                                           "config": {"start_from": {"run": 1, "step": 0}}})
    assert refused.status_code == 400 and "config.start_from" in refused.text


@pytest.mark.timeout(900)  # above its inner waits (tests/test_timeouts.py)
def test_an_sft_run_evaluates_the_policy_it_ends_with(stack, credentials):
    local, _ = stack
    api = user_api(local, credentials)
    created = api.post("/api/runs/", json={"project": credentials.project_id, "name": "sft evaluated",
                                           "environment": "calculator", "config": {
        "algorithm": {"name": "sft"}, "sft_steps": 6, "rl_steps": 0,
        "evaluation": {"tasks": 3, "samples_per_task": 1, "pass_k": [1]}}})
    assert created.status_code == 201, created.text
    run = run_ended(local, api, created.json()["id"], timeout_s=600)
    assert run["status"] == "finished", run["status_reason"]
    (evaluation,) = api.get(f"/api/runs/{run['id']}/evaluations/").json()["results"]
    assert (evaluation["index"], evaluation["step"], evaluation["status"], evaluation["episodes"]) == (
        0, 6, "complete", 3)


@pytest.mark.timeout(1100)  # above its inner waits (tests/test_timeouts.py)
def test_a_run_evaluates_other_environments_of_its_project_apart(stack, credentials):
    local, _ = stack
    api = user_api(local, credentials)
    registered = api.post("/api/environments/", json={
        "project": credentials.project_id, "name": "guess-evaluated", "kind": "python",
        "entrypoint": "environments.builtin.guessing_game:GuessingGameEnvironment"})
    assert registered.status_code == 201, registered.text
    poll_until(lambda: api.get(f"/api/environments/{registered.json()['id']}/").json()["latest_version"]["status"]
               == "ready", timeout_s=120, interval_s=0.5, what="the guessing game's probe to pass")
    created = api.post("/api/runs/", json={"project": credentials.project_id, "name": "evaluated elsewhere",
                                           "environment": "calculator", "config": {
        "algorithm": {"name": "sft"}, "sft_steps": 4, "rl_steps": 0,
        "evaluation": {"tasks": 3, "samples_per_task": 1, "pass_k": [1], "environments": ["guess-evaluated"]}}})
    assert created.status_code == 201, created.text
    assert created.json()["config"]["evaluation"]["environments"] == ["guess-evaluated@1"]
    run = run_ended(local, api, created.json()["id"], timeout_s=600)
    assert run["status"] == "finished", run["status_reason"]

    evaluations = api.get(f"/api/runs/{run['id']}/evaluations/").json()["results"]
    assert [(e["index"], e["kind"], e["environment"].split("@")[0]) for e in evaluations] == [
        (0, "environment", "calculator"), (0, "environment", "guess-evaluated")]
    for evaluation in evaluations:
        assert (evaluation["status"], evaluation["episodes"]) == ("complete", 3), evaluation["reason"]
    assert not set(evaluations[0]["trajectory_ids"]) & set(evaluations[1]["trajectory_ids"])
    points = api.get(f"/api/runs/{run['id']}/metrics/", params={
        "after_step": -1, "names": "eval/success_rate,eval/guess-evaluated@1/success_rate"}).json()["points"]
    assert {point["name"]: point["value"] for point in points} == {
        "eval/success_rate": evaluations[0]["metrics"]["success_rate"],
        "eval/guess-evaluated@1/success_rate": evaluations[1]["metrics"]["success_rate"]}
