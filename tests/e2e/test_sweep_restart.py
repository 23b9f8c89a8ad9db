"""A sweep survives a restart of the platform (issue 35, point 2), with real processes throughout: its
Optuna study lives in the platform's database, so once the web server and the platform worker (with
beat) are stopped and started again, the sweep goes on from the trials it had, numbering on, and ends
with every trial run once."""

from __future__ import annotations

from tests.e2e.conftest import private_stack, user_api
from tests.polling import poll_until

TRIALS = 3
BASE_CONFIG = {
    "sft_steps": 0, "rl_steps": 2,
    "rollout": {"group_size": 4, "groups_per_step": 2, "groups_per_task": 1, "timeout_s": 60},
}


def test_a_sweep_goes_on_after_the_platform_restarts(tmp_path):
    with private_stack(tmp_path, log_lines=40, extra_env={"TANDEM_SWEEP_INTERVAL_S": "1"}) as stack:
        credentials = stack.prepare()
        stack.start(credentials)
        api = user_api(stack, credentials)
        created = api.post("/api/sweeps/", json={
            "project": credentials.project_id, "environment": "calculator", "name": "restart",
            "base_config": BASE_CONFIG, "search_space": {
                "rl_learning_rate": {"type": "float", "low": 1e-5, "high": 1e-3, "log": True}},
            "sampler": "tpe", "metric": "reward_mean", "goal": "maximize", "max_runs": TRIALS, "concurrency": 1,
            "seed": 7})
        assert created.status_code == 201, created.text
        sweep_path = f"/api/sweeps/{created.json()['id']}/"

        def trials() -> list[dict]:
            return api.get(sweep_path).json()["trials"]

        poll_until(lambda: any(trial["state"] == "complete" for trial in trials()), timeout_s=200, interval_s=1.0,
                   between=stack.check_alive, what=lambda: f"the first trial to complete: {trials()}")
        before = trials()
        for name in ("platform-worker", "web"):
            process = stack.processes[name]
            process.terminate()
            process.wait(timeout=30)
        # The worker first: start_web checks every process it holds, and would find the stopped worker.
        stack.start_platform_worker()
        stack.start_web()

        def ended() -> dict | None:
            sweep = api.get(sweep_path).json()
            return sweep if sweep["status"] != "running" else None

        sweep = poll_until(ended, timeout_s=300, interval_s=1.0, between=stack.check_alive,
                           what=lambda: f"the sweep to end: {api.get(sweep_path).json()}")
        assert sweep["status"] == "finished", sweep["status_reason"]
        assert [trial["number"] for trial in sweep["trials"]] == list(range(TRIALS))
        assert all(trial["state"] == "complete" for trial in sweep["trials"]), sweep["trials"]
        assert len({trial["run"] for trial in sweep["trials"]}) == TRIALS  # each trial one run, none twice
        # The trials from before the restart are the study's, unchanged: the sweep went on, it did not start over.
        for old in before:
            new = sweep["trials"][old["number"]]
            assert (new["run"], new["params"]) == (old["run"], old["params"])
        assert sweep["best"]["value"] == max(trial["value"] for trial in sweep["trials"])
