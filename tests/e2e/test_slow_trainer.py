"""The staleness bound under a slow trainer, with real processes.

The trainer process is frozen (SIGSTOP) most of the time for a while: a
trainer far slower than its producers. Admission control must keep the
producers from piling up work beyond the bound, and nothing staler than
``rollout.max_staleness`` may reach the loss.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import redis

from tandem.contracts import LineageEntry, lineage_stream, run_group_counter_key
from tests.e2e.conftest import private_stack, user_api

MAX_STALENESS, GROUPS_PER_STEP, GROUP_SIZE, RL_STEPS = 1, 2, 4, 12
BOUND = (MAX_STALENESS + 1) * GROUPS_PER_STEP


@pytest.fixture
def own_stack(tmp_path):
    with private_stack(tmp_path) as stack:
        yield stack


def _consumed_groups(client: redis.Redis, run_id: int) -> int:
    entries = [LineageEntry.from_stream_fields(fields) for _, fields in client.xrange(lineage_stream(run_id))]
    return len({group for entry in entries for group in entry.group_ids})


def _appended(client: redis.Redis, run_id: int) -> int:
    return int(client.xinfo_stream(f"tandem:run:{run_id}:trajectories")["entries-added"])


class OutstandingSampler(threading.Thread):
    """Samples groups requested minus groups the trainer has accounted for, every 50 ms."""

    def __init__(self, client: redis.Redis, run_id: int):
        super().__init__(daemon=True)
        self.client, self.run_id = client, run_id
        self.samples: list[int] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            requested = int(self.client.get(run_group_counter_key(self.run_id)) or 0)
            self.samples.append(requested - _consumed_groups(self.client, self.run_id))
            time.sleep(0.05)


def test_the_staleness_bound_holds_when_the_trainer_is_much_slower_than_its_producers(own_stack):
    stack = own_stack
    credentials = stack.prepare()
    stack.start(credentials)
    client = redis.Redis.from_url(stack.config.redis_url)
    api = user_api(stack, credentials)
    run_id = api.post("/api/runs/", json={
        "project": credentials.project_id, "name": "slow trainer", "environment": "calculator",
        "config": {"sft_steps": 2, "rl_steps": RL_STEPS, "rollout": {
            "max_staleness": MAX_STALENESS, "groups_per_step": GROUPS_PER_STEP, "group_size": GROUP_SIZE,
            "groups_per_task": 1,
            # Without the staleness bound the trainer would keep 9 steps of work requested.
            "backlog_steps": 8}},
    }).json()["id"]
    sampler = OutstandingSampler(client, run_id)
    sampler.start()

    deadline = time.monotonic() + 300
    while _consumed_groups(client, run_id) < GROUPS_PER_STEP:  # RL has started
        assert time.monotonic() < deadline, "RL never started"
        time.sleep(0.1)
    trainer = stack.processes["trainer"]
    # 30 s of a trainer that runs a quarter of the time.
    for _ in range(15):
        os.kill(trainer.pid, signal.SIGSTOP)
        time.sleep(1.5)
        os.kill(trainer.pid, signal.SIGCONT)
        time.sleep(0.5)
    # Then frozen: producers finish what they were given and go idle instead of running ahead.
    os.kill(trainer.pid, signal.SIGSTOP)
    appended_at_freeze = _appended(client, run_id)
    time.sleep(8)
    appended_while_frozen = _appended(client, run_id) - appended_at_freeze
    os.kill(trainer.pid, signal.SIGCONT)

    while (status := api.get(f"/api/runs/{run_id}/").json()["status"]) not in {"finished", "failed"}:
        assert time.monotonic() < deadline + 300, "the run did not finish"
        time.sleep(1)
    sampler.stopped.set()
    sampler.join()
    assert status == "finished"

    # Admission: requested and not yet accounted for never exceeded the bound, plus the one step's
    # groups the trainer holds between taking them and logging them as trained.
    assert max(sampler.samples) <= BOUND + GROUPS_PER_STEP, max(sampler.samples)
    assert appended_while_frozen <= (BOUND + GROUPS_PER_STEP) * GROUP_SIZE, appended_while_frozen

    # Consumption: nothing staler than the bound reached the loss.
    points = api.get(f"/api/runs/{run_id}/metrics/",
                     params={"after_step": -1, "names": "staleness_max"}).json()["points"]
    assert len(points) == RL_STEPS
    assert max(point["value"] for point in points) <= MAX_STALENESS
    client.close()
