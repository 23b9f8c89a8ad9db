"""A learning proof without code: an HTTP environment that has no demonstrations, a dataset of them
uploaded over REST, and the default config (SFT on the dataset, then GRPO) raising its success rate.

Everything goes through the REST API, as a new user would: register the server, upload the file,
create the run, read its metrics. ``bench/learning.py --source http-dataset`` measures the same run.
"""

from __future__ import annotations

import statistics

import httpx
import pytest

from environments.builtin.calculator import CalculatorEnvironment
from environments.http_example_server import demonstrations_dataset
from tests.e2e.conftest import (
    dataset_stored,
    example_http_environment,
    register_http_environment,
    run_ended,
    user_api,
)

# RL steps averaged at each end of the run: the first are the policy SFT left.
WINDOW = 5
# The bar is 30 points within 10 minutes (bench/learning.py measures it); a test run on a
# busy CI machine gets some slack, and still fails if GRPO does not learn.
MIN_GAIN = 0.2


def _metric(api: httpx.Client, run_id: int, name: str) -> dict[int, float]:
    points = api.get(f"/api/runs/{run_id}/metrics/", params={"after_step": -1, "names": name}).json()["points"]
    return {point["step"]: point["value"] for point in points}


@pytest.mark.timeout(1800)  # above its inner waits (tests/test_timeouts.py)
def test_sft_on_an_uploaded_dataset_then_grpo_raises_the_success_of_an_http_environment(stack, credentials):
    local, _ = stack
    api = user_api(local, credentials)
    project = credentials.project_id
    # The server answers no /demonstrations (and no /close): the protocol's required routes only.
    with example_http_environment(latency_ms=0) as url:
        register_http_environment(api, project_id=project, name="calculator-over-http", url=f"{url}/faults/minimal")

        refused = api.post("/api/runs/", json={"project": project, "name": "no data",
                                               "environment": "calculator-over-http", "config": {}})
        assert refused.status_code == 400, refused.text
        assert "config.sft_steps" in refused.text

        dataset = demonstrations_dataset(CalculatorEnvironment(), count=2000, seed=11)
        uploaded = api.post("/api/datasets/", data={"project": str(project), "name": "calculator-demos"},
                            files={"file": ("demos.jsonl", dataset.encode(), "application/jsonl")})
        dataset_stored(local, api, uploaded)

        created = api.post("/api/runs/", json={
            "project": project, "name": "sft on a dataset, then grpo", "environment": "calculator-over-http",
            "config": {"sft": {"datasets": [{"name": "calculator-demos"}]}}})
        assert created.status_code == 201, created.text
        run_id = created.json()["id"]
        config = created.json()["config"]

        run = run_ended(local, api, run_id, timeout_s=1200)
        assert run["status"] == "finished", run["status_reason"]

    # The SFT phase trained on the dataset alone, for the default number of steps.
    rows = _metric(api, run_id, "algorithm/sft/rows/0")
    assert sorted(rows) == list(range(1, config["sft_steps"] + 1))
    assert set(rows.values()) == {float(config["sft_batch_size"])}
    assert _metric(api, run_id, "algorithm/sft/rows/demonstrations") in ({}, dict.fromkeys(rows, 0.0))

    success = [value for _, value in sorted(_metric(api, run_id, "success_rate").items())]
    assert len(success) == config["rl_steps"]
    after_sft = statistics.fmean(success[:WINDOW])
    after_grpo = statistics.fmean(success[-WINDOW:])
    assert after_grpo - after_sft >= MIN_GAIN, f"success by RL step: {[round(value, 2) for value in success]}"
