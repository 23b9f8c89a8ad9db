"""A whole run that SFTs on an uploaded dataset alone: the trainer reads its rows from the platform."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import dataset_stored, run_ended, user_api

SFT_STEPS = 4


def _conversation(a: int, b: int) -> dict:
    return {"messages": [
        {"role": "system", "content": "Use the calculator."},
        {"role": "user", "content": f"What is {a}*{b}?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "calc", "arguments": json.dumps({"expression": f"{a}*{b}"})}}]},
        {"role": "tool", "content": str(a * b)},
        {"role": "assistant", "content": f"A:{a * b}"},
    ]}


@pytest.mark.timeout(900)  # above its inner waits (tests/test_timeouts.py)
def test_a_run_trains_its_sft_steps_on_a_dataset_and_shows_it(stack, credentials):
    local, _ = stack
    api = user_api(local, credentials)
    content = "".join(json.dumps(_conversation(a, a + 3)) + "\n" for a in range(2, 12))
    uploaded = api.post("/api/datasets/", data={"project": str(credentials.project_id), "name": "e2e-calls"},
                        files={"file": ("calls.jsonl", content.encode(), "application/jsonl")})
    dataset_stored(local, api, uploaded)
    dataset_id = uploaded.json()["id"]

    created = api.post("/api/runs/", json={"project": credentials.project_id, "name": "sft on a dataset",
                                           "environment": "calculator", "config": {
        "algorithm": {"name": "sft"}, "sft_steps": SFT_STEPS, "sft_batch_size": 4, "rl_steps": 0,
        "sft": {"datasets": [{"name": "e2e-calls"}], "demonstrations_weight": 0}}})
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]
    assert created.json()["config"]["sft"]["datasets"] == [{"name": "e2e-calls", "version": 1, "weight": 1.0}]

    run = run_ended(local, api, run_id, timeout_s=300)
    assert run["status"] == "finished", run["status_reason"]

    names = "loss,algorithm/sft/rows/0,algorithm/sft/tokens"
    points = api.get(f"/api/runs/{run_id}/metrics/", params={"after_step": -1, "names": names}).json()["points"]
    by_name: dict[str, dict[int, float]] = {}
    for point in points:
        by_name.setdefault(point["name"], {})[point["step"]] = point["value"]
    assert sorted(by_name["loss"]) == list(range(1, SFT_STEPS + 1))
    # Every example of every step came from the dataset, and each step trained on tokens.
    assert by_name["algorithm/sft/rows/0"] == {step: 4.0 for step in range(1, SFT_STEPS + 1)}
    assert all(tokens > 0 for tokens in by_name["algorithm/sft/tokens"].values())
    # The run says which data it used: the version it pinned, which later uploads never change.
    assert run["config"]["sft"]["datasets"] == [{"name": "e2e-calls", "version": 1, "weight": 1.0}]
    assert api.get(f"/api/datasets/{dataset_id}/").json()["latest_version"]["row_count"] == 10
