"""The shared trainer never waits on one run: a run stuck on a dataset the platform cannot serve fails
with its reason after bounded retries, and another project's run is trained meanwhile.

The broken dataset: a version whose stored row the platform cannot read back. One row's metadata is
made 5,000 levels deep in PostgreSQL (as a row stored before uploads refused such nesting, or a
restore, leaves it): jsonb holds it, but every read of a page holding it raises RecursionError in
Django's json.loads, so the rows API answers 500 for good, with today's code and after.
"""

from __future__ import annotations

import json

import psycopg

from tests.e2e.conftest import private_stack, run_ended, user_api
from tests.polling import poll_until

DEEP_METADATA = '{"deep": ' + "[" * 5000 + "]" * 5000 + "}"
# 2 retries (3 tries) of a 500: the run fails within seconds rather than the default's seven.
SERVER_ERROR_RETRIES = 2


def _conversation(a: int) -> dict:
    return {"messages": [{"role": "user", "content": f"What is {a}+1?"},
                         {"role": "assistant", "content": f"A:{a + 1}"}]}


def _upload(api, project_id: int, name: str) -> int:
    content = "".join(json.dumps(_conversation(a)) + "\n" for a in range(10))
    uploaded = api.post("/api/datasets/", data={"project": str(project_id), "name": name},
                        files={"file": ("rows.jsonl", content.encode(), "application/jsonl")})
    assert uploaded.status_code in (201, 202), uploaded.text
    dataset_id = uploaded.json()["id"]

    def stored() -> bool:
        version = api.get(f"/api/datasets/{dataset_id}/").json().get("latest_version") or {}
        # Rows are stored by the datasets worker: "ready" once every row is in.
        return version.get("row_count") == 10 and version.get("status", "ready") == "ready"

    poll_until(stored, timeout_s=120, interval_s=0.5, what=f"dataset {name}'s rows to be stored")
    return dataset_id


def test_a_run_on_a_broken_dataset_fails_with_its_reason_and_another_projects_run_finishes(tmp_path):
    with private_stack(tmp_path, redis_db=5, log_lines=40,
                       extra_env={"TANDEM_TRAINER_SERVER_ERROR_RETRIES": str(SERVER_ERROR_RETRIES)}) as stack:
        alice = stack.prepare(username="alice", project="team-a")
        bob = stack.prepare(username="bob", project="team-b")  # the trainer's token is the newest bootstrap's
        # Everything but the trainer: both runs are queued before it claims the first.
        stack.start_web()
        stack.start_platform_worker()
        stack.start_platform_queue_workers()
        stack.start_workers()
        api_a, api_b = user_api(stack, alice), user_api(stack, bob)

        dataset_id = _upload(api_a, alice.project_id, "broken")
        created_a = api_a.post("/api/runs/", json={
            "project": alice.project_id, "name": "stuck on a broken dataset", "environment": "calculator",
            "config": {"algorithm": {"name": "sft"}, "sft_steps": 2, "sft_batch_size": 2, "rl_steps": 0,
                       "sft": {"datasets": [{"name": "broken"}], "demonstrations_weight": 0}}})
        assert created_a.status_code == 201, created_a.text
        with psycopg.connect(stack.config.database_url, autocommit=True) as database:
            broken = database.execute(
                "UPDATE datasets_datasetrow SET metadata = %s::jsonb WHERE index = 3 AND version_id = "
                "(SELECT id FROM datasets_datasetversion WHERE dataset_id = %s)",
                (DEEP_METADATA, dataset_id)).rowcount
        assert broken == 1
        # The platform cannot serve the version any more, to anyone.
        assert api_a.get(f"/api/datasets/{dataset_id}/versions/1/rows/").status_code == 500

        created_b = api_b.post("/api/runs/", json={
            "project": bob.project_id, "name": "another project's run", "environment": "calculator",
            "config": {"sft_steps": 0, "rl_steps": 2,
                       "rollout": {"group_size": 2, "groups_per_step": 1, "groups_per_task": 1}}})
        assert created_b.status_code == 201, created_b.text

        stack.start_trainer(trainer_token=bob.trainer_token)
        # Before, the trainer asked for A's rows for as long as it lived, and B stayed queued.
        run_b = run_ended(stack, api_b, created_b.json()["id"], timeout_s=600)
        run_a = run_ended(stack, api_a, created_a.json()["id"], timeout_s=60)

    assert run_b["status"] == "finished", run_b["status_reason"]
    assert run_a["status"] == "failed"
    reason = run_a["status_reason"]
    assert "PlatformRequestFailedError" in reason, reason
    assert f"/api/trainer/runs/{run_a['id']}/datasets/broken/versions/1/rows/" in reason
    assert f"HTTP 500 on all {SERVER_ERROR_RETRIES + 1} tries" in reason
