"""The shared trainer never waits on one run: a run stuck on a dataset the platform cannot serve is set
aside after bounded retries, another project's run is trained meanwhile, and the stuck run fails with its
reason once its restarts are used up.

The broken dataset: a version whose stored row the platform cannot read back. One row's metadata is
made 5,000 levels deep in PostgreSQL (as a row stored before uploads refused such nesting, or a
restore, leaves it): jsonb holds it, but every read of a page holding it raises RecursionError in
Django's json.loads, so the rows API answers 500 for good, with today's code and after.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timedelta

import psycopg
import pytest

from tests.e2e.conftest import private_stack, run_ended, user_api
from tests.polling import poll_until

DEEP_METADATA = '{"deep": ' + "[" * 5000 + "]" * 5000 + "}"
# 2 retries (3 tries) of a 500: the run is set aside within seconds rather than the default's seven.
SERVER_ERROR_RETRIES = 2
# The default: long enough for the trainer to claim and train the other project's run first.
SET_ASIDE_S = 60
# Restarts of the stuck run: each set-aside is one, and it fails at the third.
MAX_RESTARTS = 2

logger = logging.getLogger(__name__)


def _at(timestamp: str) -> datetime:
    return datetime.fromisoformat(timestamp)


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


@pytest.mark.timeout(1300)  # above its inner waits (tests/test_timeouts.py)
def test_a_run_on_a_broken_dataset_is_set_aside_while_another_projects_run_finishes_then_fails_with_its_reason(
    tmp_path,
):
    with private_stack(tmp_path, log_lines=40,
                       extra_env={"TANDEM_TRAINER_SERVER_ERROR_RETRIES": str(SERVER_ERROR_RETRIES),
                                  "TANDEM_TRAINER_SET_ASIDE_S": str(SET_ASIDE_S)}) as stack:
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
                       "max_restarts": MAX_RESTARTS,
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
        run_b = run_ended(stack, api_b, created_b.json()["id"], timeout_s=600)
        run_a = run_ended(stack, api_a, created_a.json()["id"], timeout_s=MAX_RESTARTS * SET_ASIDE_S + 300)

    assert run_b["status"] == "finished", run_b["status_reason"]
    # Read from the records: A's first attempt ended queued (set aside) before B's began, and A was
    # claimed again only after B had finished, the set-aside over. Before, A's one attempt failed, and
    # only then was B claimed.
    attempts_a = run_a["attempt_history"]
    assert [attempt["outcome"] for attempt in attempts_a] == ["queued"] * MAX_RESTARTS + ["failed"], attempts_a
    set_aside_at, b_started = _at(attempts_a[0]["ended_at"]), _at(run_b["attempt_history"][0]["started_at"])
    b_finished, a_claimed_again = _at(run_b["finished_at"]), _at(attempts_a[1]["started_at"])
    assert set_aside_at < b_started < b_finished < a_claimed_again < _at(run_a["finished_at"])
    for given_back, claimed in zip(attempts_a, attempts_a[1:], strict=False):
        assert _at(claimed["started_at"]) - _at(given_back["ended_at"]) >= timedelta(seconds=SET_ASIDE_S)
        assert f"restart {given_back['number']} of {MAX_RESTARTS}: queued again, claimable from" in given_back["reason"]
    logger.info("run A set aside at %s, claimed again %.1f s later; run B claimed %.1f s and finished %.1f s after "
                "A was set aside; A failed %.1f s after B finished", set_aside_at,
                (a_claimed_again - set_aside_at).total_seconds(), (b_started - set_aside_at).total_seconds(),
                (b_finished - set_aside_at).total_seconds(), (_at(run_a["finished_at"]) - b_finished).total_seconds())

    assert (run_a["status"], run_a["restarts"]) == ("failed", MAX_RESTARTS)
    reason = run_a["status_reason"]
    assert f"set the run aside for {SET_ASIDE_S} s: PlatformRequestFailedError" in reason, reason
    assert f"/api/trainer/runs/{run_a['id']}/datasets/broken/versions/1/rows/" in reason
    assert f"HTTP 500 on all {SERVER_ERROR_RETRIES + 1} tries" in reason
    assert f"no restarts left (config.max_restarts={MAX_RESTARTS})" in reason
