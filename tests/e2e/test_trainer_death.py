"""A trainer SIGKILLed mid-run: the reaper queues the run again, a new trainer resumes it from its checkpoint.

Real processes throughout (web, the platform's reaper, two rollout workers,
two trainers one after the other), real Redis and PostgreSQL.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import redis

from policy.weights import RedisWeightSubscriber
from tandem.cli.stack import LocalStack
from tandem.contracts import LineageEntry, lineage_stream
from tests.e2e.conftest import private_stack, user_api

# The kill waits for the moment the newest update is one past a checkpoint, which lasts one step;
# 30 RL steps give it eight such moments, so a fast pipeline (a step in about 0.1 s once nothing
# compiles mid-run) cannot finish the run before the 50 ms poll catches one.
SFT_STEPS, RL_STEPS, CHECKPOINT_EVERY, GROUP_SIZE, GROUPS_PER_STEP = 4, 30, 3, 4, 2


@pytest.fixture
def own_stack(tmp_path):
    """A stack of its own (Redis db 10), with a reaper that gives up on a trainer after 10 s."""
    with private_stack(tmp_path, log_lines=30,
                       extra_env={"TANDEM_TRAINER_HEARTBEAT_TIMEOUT_S": "10", "TANDEM_REAPER_INTERVAL_S": "1"}) as stack:
        yield stack


class VersionWatcher(threading.Thread):
    """Samples the published policy version every 20 ms, as a producer would see it."""

    def __init__(self, client: redis.Redis, run_id: int):
        super().__init__(daemon=True)
        self.subscriber = RedisWeightSubscriber(client)
        self.run_id = run_id
        self.seen: list[int] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            version = self.subscriber.latest_version(self.run_id)
            if version is not None and (not self.seen or self.seen[-1] != version):
                self.seen.append(version)
            time.sleep(0.02)


def _lineage(client: redis.Redis, run_id: int) -> list[LineageEntry]:
    return [LineageEntry.from_stream_fields(fields) for _, fields in client.xrange(lineage_stream(run_id))]


def _wait_for(predicate, *, timeout_s: float, what: str, stack: LocalStack) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        for name, process in stack.processes.items():
            if name != "trainer":
                assert process.poll() is None, f"{name} died"
        time.sleep(0.05)


@pytest.mark.timeout(1100)  # above its inner waits (tests/test_timeouts.py)
def test_a_killed_trainer_is_reaped_and_its_run_resumes_exactly(own_stack):
    stack = own_stack
    credentials = stack.prepare()
    stack.start(credentials)
    client = redis.Redis.from_url(stack.config.redis_url)
    api = user_api(stack, credentials)
    created = api.post("/api/runs/", json={
        "project": credentials.project_id, "name": "trainer death", "environment": "calculator",
        "config": {"sft_steps": SFT_STEPS, "rl_steps": RL_STEPS, "checkpoint": {"every": CHECKPOINT_EVERY},
                   "rollout": {"group_size": GROUP_SIZE, "groups_per_step": GROUPS_PER_STEP, "groups_per_task": 1,
                               "timeout_s": 60}},
    })
    assert created.status_code == 201, created.text
    run_id = created.json()["id"]
    watcher = VersionWatcher(client, run_id)
    watcher.start()

    # Kill the trainer right after an RL update that no checkpoint holds yet.
    def trained_past_a_checkpoint() -> bool:
        trained = [entry for entry in _lineage(client, run_id) if entry.kind == "trained"]
        return bool(trained) and trained[-1].step >= SFT_STEPS + 5 and trained[-1].step % CHECKPOINT_EVERY == 1

    _wait_for(trained_past_a_checkpoint, timeout_s=300, what="RL updates past a checkpoint", stack=stack)
    victim = stack.processes["trainer"]
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait(timeout=10)
    killed_at_step = max(entry.step for entry in _lineage(client, run_id) if entry.kind == "trained")
    version_at_kill = watcher.seen[-1]

    # The reaper notices the silence and queues the run again on its own (config.max_restarts), saying why.
    _wait_for(lambda: api.get(f"/api/runs/{run_id}/").json()["restarts"] == 1,
              timeout_s=60, what="the reaper to restart the run", stack=stack)
    requeued = api.get(f"/api/runs/{run_id}/").json()
    assert requeued["status"] == "queued", requeued
    assert "sent no heartbeat since" in requeued["status_reason"], requeued["status_reason"]
    assert "restart 1 of 3" in requeued["status_reason"], requeued["status_reason"]

    # A new trainer process (`tandem up` restarts a crashed one) claims it: no one resumes it by hand.
    stack.start_trainer(trainer_token=credentials.trainer_token, name="trainer-2")
    _wait_for(lambda: api.get(f"/api/runs/{run_id}/").json()["status"] in {"finished", "failed"},
              timeout_s=400, what="the resumed run to end", stack=stack)
    watcher.stopped.set()
    watcher.join()

    run = api.get(f"/api/runs/{run_id}/").json()
    assert run["status"] == "finished", run["status_reason"]
    assert run["attempts"] == 2 and run["trainer_step"] == SFT_STEPS + RL_STEPS
    # The run's page and API show both attempts: the dead trainer's, ended by the restart, and the new one's.
    assert [attempt["outcome"] for attempt in run["attempt_history"]] == ["queued", "finished"]
    assert "sent no heartbeat since" in run["attempt_history"][0]["reason"]

    # Policy versions only ever went up, and the resumed trainer's are newer than any before the kill.
    assert watcher.seen == sorted(watcher.seen), watcher.seen
    assert watcher.seen[-1] > version_at_kill

    log = (stack.log_dir / "trainer-2.log").read_text(errors="replace")
    assert "resumes from its checkpoint of step" in log, log[-3000:]
    checkpoint_step = int(log.split("resumes from its checkpoint of step ")[1].split()[0])
    assert SFT_STEPS < checkpoint_step < killed_at_step and checkpoint_step % CHECKPOINT_EVERY == 0

    lineage = _lineage(client, run_id)
    old_worker = lineage[0].worker
    final: dict[int, LineageEntry] = {}
    for entry in lineage:
        if entry.kind == "trained":
            final[entry.step] = entry  # the newest entry of a step is the surviving one
    assert sorted(final) == list(range(SFT_STEPS + 1, SFT_STEPS + RL_STEPS + 1))
    trained_ids = [trajectory for entry in final.values() for trajectory in entry.trajectory_ids]
    # No trajectory reached the surviving parameters twice.
    assert len(trained_ids) == len(set(trained_ids)) == RL_STEPS * GROUPS_PER_STEP * GROUP_SIZE
    # Up to the checkpoint, the surviving steps are the dead trainer's; after it, the new trainer's.
    assert {final[step].worker for step in final if step <= checkpoint_step} == {old_worker}
    assert old_worker not in {final[step].worker for step in final if step > checkpoint_step}
    # Updates the kill threw away were redone on the same data, or their data was dropped as
    # too stale (and counted): none of it was lost.
    discarded = {trajectory for entry in lineage if entry.kind == "trained" and entry.worker == old_worker
                 and entry.step > checkpoint_step for trajectory in entry.trajectory_ids}
    dropped = {trajectory for entry in lineage if entry.kind == "dropped" for trajectory in entry.trajectory_ids}
    assert discarded, "the kill discarded no update; the test did not exercise a rollback"
    assert discarded <= set(trained_ids) | dropped

    # Groups given up on are exactly the episodes the telemetry counts as lost.
    lost_groups = [group for entry in lineage if entry.kind == "lost" for group in entry.group_ids]
    points = api.get(f"/api/runs/{run_id}/metrics/",
                     params={"after_step": -1, "names": "episodes_lost"}).json()["points"]
    assert sum(point["value"] for point in points) == GROUP_SIZE * len(lost_groups)
    client.close()
