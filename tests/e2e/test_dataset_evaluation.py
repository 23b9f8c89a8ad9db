"""Held-out evaluation on a dataset in a whole run: SFT trains on its training rows, every evaluation
scores the published policy on its held-out rows beside the environment's tasks, and an evaluation-only
run of the final checkpoint scores the same rows the same."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import dataset_stored, run_ended, user_api

SFT_STEPS = 8
RL_STEPS = 2


def _conversation(a: int, b: int, split: str) -> dict:
    return {"messages": [
        {"role": "user", "content": f"What is {a}*{b}?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "calc", "arguments": json.dumps({"expression": f"{a}*{b}"})}}]},
        {"role": "tool", "content": str(a * b)},
        {"role": "assistant", "content": f"A:{a * b}"},
    ], "metadata": {"split": split}}


@pytest.mark.timeout(1800)  # above its inner waits (tests/test_timeouts.py)
def test_a_run_scores_each_published_policy_on_a_datasets_held_out_rows(stack, credentials):
    local, _ = stack
    api = user_api(local, credentials)
    rows = [_conversation(a, a + 7, "evaluation" if a % 4 == 0 else "train") for a in range(2, 42)]
    content = "".join(json.dumps(row) + "\n" for row in rows)
    uploaded = api.post("/api/datasets/", data={"project": str(credentials.project_id), "name": "held-out-calls"},
                        files={"file": ("calls.jsonl", content.encode(), "application/jsonl")})
    dataset_stored(local, api, uploaded)

    created = api.post("/api/runs/", json={"project": credentials.project_id, "name": "dataset evaluated",
                                           "environment": "calculator", "config": {
        "sft_steps": SFT_STEPS, "sft_batch_size": 8, "rl_steps": RL_STEPS,
        "sft": {"datasets": [{"name": "held-out-calls"}]},
        "evaluation": {"every_steps": 2, "tasks": 2, "samples_per_task": 1, "temperature": 0,
                       "datasets": [{"name": "held-out-calls"}], "dataset_rows": 8}}})
    assert created.status_code == 201, created.text
    assert created.json()["config"]["evaluation"]["datasets"] == [{"name": "held-out-calls", "version": 1}]
    run_id = created.json()["id"]
    run = run_ended(local, api, run_id, timeout_s=600)
    assert run["status"] == "finished", run["status_reason"]

    evaluations = api.get(f"/api/runs/{run_id}/evaluations/").json()["results"]
    # Each point (before RL and at its end) evaluated the environment and the dataset.
    assert sorted((e["index"], e["kind"]) for e in evaluations) == [
        (0, "dataset"), (0, "environment"), (1, "dataset"), (1, "environment")]
    on_dataset = sorted((e for e in evaluations if e["kind"] == "dataset"), key=lambda e: e["index"])
    for evaluation in on_dataset:
        assert evaluation["status"] == "complete", evaluation["reason"]
        assert (evaluation["environment"], evaluation["tasks"], evaluation["episodes"]) == ("held-out-calls@1", 8, 8)
        assert evaluation["metrics"]["loss"] > 0 and evaluation["metrics"]["tokens"] > 0
        low, high = evaluation["intervals"]["loss"]
        assert low <= evaluation["metrics"]["loss"] <= high
        assert evaluation["trajectory_ids"] == []
    assert [e["step"] for e in on_dataset] == [SFT_STEPS, SFT_STEPS + RL_STEPS]
    points = api.get(f"/api/runs/{run_id}/metrics/", params={
        "after_step": -1, "names": "eval/dataset:held-out-calls@1/loss"}).json()["points"]
    assert [point["value"] for point in points] == [e["metrics"]["loss"] for e in on_dataset]

    # An evaluation-only run of the final checkpoint scores the held-out rows exactly as the run's end did.
    replay = api.post(f"/api/runs/{run_id}/evaluate/", json={"step": SFT_STEPS + RL_STEPS})
    assert replay.status_code == 201, replay.text
    ended = run_ended(local, api, replay.json()["id"], timeout_s=600)
    assert ended["status"] == "finished", ended["status_reason"]
    replayed = [e for e in api.get(f"/api/runs/{ended['id']}/evaluations/").json()["results"] if e["kind"] == "dataset"]
    assert len(replayed) == 1
    assert replayed[0]["metrics"]["loss"] == on_dataset[-1]["metrics"]["loss"]
    assert replayed[0]["metrics"]["token_accuracy"] == on_dataset[-1]["metrics"]["token_accuracy"]
