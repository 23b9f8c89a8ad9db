"""Environments that raise, hang, return garbage or flood the context, in a whole run: the run goes on."""

from __future__ import annotations

import time

from tandem.contracts import trajectory_stream
from tests.e2e.conftest import StreamObserver, user_api

RL_STEPS, GROUPS_PER_STEP, GROUP_SIZE = 4, 4, 2
# With run seed 0, the first 16 groups' tasks hold every fault, and the first group is healthy.
SEED = 0

REASONS = {
    "raise": "step raised RuntimeError: the environment broke",
    "hang": "step timed out after 1s",
    "garbage": "step returned a dict, expected StepResult",
    "oversized": "step returned an observation of 20000 chars, more than max_observation_chars=8192",
}


def test_episodes_of_a_faulty_environment_fail_with_their_reasons_and_the_run_trains_on(stack, credentials):
    local, _ = stack
    api = user_api(local, credentials)
    api.post("/api/environments/", json={
        "project": credentials.project_id, "name": "second-step-faults", "kind": "python",
        "entrypoint": "tests.e2e.faulty_environments:SecondStepFaultEnvironment",
    }).raise_for_status()
    created = api.post("/api/runs/", json={
        "project": credentials.project_id, "name": "environment faults", "environment": "second-step-faults",
        "config": {"sft_steps": 0, "rl_steps": RL_STEPS, "seed": SEED,
                   "rollout": {"groups_per_step": GROUPS_PER_STEP, "group_size": GROUP_SIZE, "groups_per_task": 1,
                               "max_turns": 3, "environment_timeout_s": 1.0},
                   "sampling": {"max_new_tokens": 8}},
    })
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]
    observer = StreamObserver(local.config.redis_url, trajectory_stream(run_id))
    observer.start()

    deadline = time.monotonic() + 300
    while (run := api.get(f"/api/runs/{run_id}/").json())["status"] not in {"finished", "failed", "cancelled"}:
        assert time.monotonic() < deadline, f"the run did not end: {run}"
        local.check_alive()
        time.sleep(1)
    observer.stop.set()
    observer.join(5)
    # The run went on through its faults, and trained every step.
    assert run["status"] == "finished", run["status_reason"]
    assert run["policy_version"] == RL_STEPS

    records = observer.records
    reasons = {record.failure_reason for record in records if record.status == "failed"}
    met = {fault for fault, reason in REASONS.items() if reason in reasons}
    # Each fault failed its own episodes with its reason. The circuit breaker (five failed episodes
    # in a row in one producer) may fail later ones fast instead, so not every fault need show.
    assert len(met) >= 2, reasons
    assert reasons <= set(REASONS.values()) | {r for r in reasons if r.startswith("circuit open")}, reasons
    assert all(sum(record.loss_mask) == 0 and record.reward == 0.0
               for record in records if record.status == "failed")
    assert sum(record.status == "ok" for record in records) >= GROUP_SIZE  # healthy episodes ran beside them

    # The timeline shows the failed episodes the steps consumed, with their reasons.
    timeline = api.get(f"/api/runs/{run_id}/timeline/", params={"last": 50}).json()
    consumed = [episode for step in timeline["steps"] for episode in step["episodes"]]
    # The timeline stores a reason's start (a circuit-open reason quotes the last one in full).
    shown = {e["failure_reason"] for e in consumed if e["status"] == "failed"}
    assert all(any(reason.startswith(start) for reason in reasons) for start in shown), (shown, reasons)
    assert any(e["status"] == "failed" for e in consumed)
    error_rates = [point["value"] for point in api.get(
        f"/api/runs/{run_id}/metrics/",
        params={"after_step": -1, "names": "rollout/second-step-faults/error_rate"}).json()["points"]]
    assert error_rates and max(error_rates) > 0
