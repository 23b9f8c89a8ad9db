"""A trainer of two processes trains one run over a mesh that spans both, and both resume it exactly.

Real processes throughout, each on its host of a test network (tests/e2e/multi_host.py):
web, the platform's reaper and Redis on host A, a rollout worker on host B, and two
``tandem trainer`` processes joined into one JAX job by ``jax.distributed``, two CPU
devices each: process 0 on host D, process 1 on host E, which reaches only process 0
(the coordinator, and Gloo's collectives). The stack's usual single trainer is not started.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tandem.cli.stack import Credentials, LocalStack
from tandem.runtime.local_ports import free_local_port
from tests.e2e.conftest import run_ended, user_api
from tests.e2e.multi_host import TRAINER_HOST, multi_host_stack
from tests.network_hosts import Host
from tests.polling import poll_until
from trainer.lockstep import LOST_PROCESS_EXIT_CODE

# checkpoint.every 3 and RL steps of two groups of 4 episodes: the batch (8 rows, and SFT's 4)
# splits over data x fsdp = 4 devices. Twelve RL steps leave room to kill the trainer after its
# first RL checkpoint and still have steps to train after the resume.
SFT_STEPS, RL_STEPS, CHECKPOINT_EVERY, GROUP_SIZE, GROUPS_PER_STEP = 2, 12, 3, 4, 2
RUN_CONFIG = {
    "sft_steps": SFT_STEPS, "sft_batch_size": 4, "rl_steps": RL_STEPS, "checkpoint": {"every": CHECKPOINT_EVERY},
    "mesh": {"data": 2, "fsdp": 2},
    "rollout": {"group_size": GROUP_SIZE, "groups_per_step": GROUPS_PER_STEP, "groups_per_task": 1, "timeout_s": 60},
}
TRAINED = re.compile(r"process (\d) of 2 trained step (\d+) \((sft|rl)\): loss \S+, metrics (\{.*\})")


FOLLOWER_HOST = "host-e"


class TwoProcessTrainer:
    """``tandem trainer`` twice, as LocalStack.start_trainer starts it, joined into one JAX job."""

    def __init__(self, stack: LocalStack, credentials: Credentials, hosts: tuple[Host, Host]):
        self.stack, self.credentials, self.hosts = stack, credentials, hosts
        self.attempt = 0

    def start(self) -> tuple[subprocess.Popen, subprocess.Popen]:
        self.attempt += 1
        # JAX's coordinator listens on process 0's host; the port is free there (a namespace of its own).
        coordinator = f"{self.hosts[0].address}:{free_local_port()}"
        processes = []
        for process_id in (0, 1):
            name = self.log_name(process_id)
            env = {**{name: value for name, value in self.stack.env().items() if name != "DATABASE_URL"},
                   "TANDEM_TRAINER_TOKEN": self.credentials.trainer_token,
                   "TANDEM_COORDINATOR_ADDRESS": coordinator, "TANDEM_NUM_PROCESSES": "2",
                   "TANDEM_PROCESS_ID": str(process_id), "JAX_PLATFORMS": "cpu",
                   "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
                   "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
            command = self.hosts[process_id].command([
                sys.executable, "-m", "tandem.cli", "trainer", "--platform-url", self.stack.config.platform_url,
                # The same path on both hosts: Orbax writes each host's shards and commits once.
                "--checkpoint-dir", str(self.stack.config.var_dir / "checkpoints")])
            with open(self.stack.log_dir / f"{name}.log", "ab") as log:
                # The stack stops (and the test kills) it by its process group, as it does its own.
                process = subprocess.Popen(command, cwd=Path(__file__).resolve().parents[2], env=env, stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True)
            self.stack.processes[name] = process
            processes.append(process)
        return processes[0], processes[1]

    def log_name(self, process_id: int, attempt: int | None = None) -> str:
        return f"trainer-{attempt or self.attempt}-process-{process_id}"

    def log(self, process_id: int, attempt: int | None = None) -> str:
        return (self.stack.log_dir / f"{self.log_name(process_id, attempt)}.log").read_text(errors="replace")

    def metrics(self, process_id: int, attempt: int) -> dict[int, str]:
        """Step -> the metrics this process logged for it (loss, grad norm...; exact floats, as written)."""
        found = {}
        for match in TRAINED.finditer(self.log(process_id, attempt)):
            assert int(match.group(1)) == process_id
            found[int(match.group(2))] = match.group(4)
        return found

    def kill(self, process_ids: tuple[int, ...] = (0, 1)) -> None:
        for process_id in process_ids:
            process = self.stack.processes.pop(self.log_name(process_id))
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def _checkpoint_steps(api: httpx.Client, run_id: int) -> list[int]:
    listed = api.get(f"/api/runs/{run_id}/checkpoints/?page_size=100").json()["results"]
    return sorted(checkpoint["step"] for checkpoint in listed)


def _committed_on_disk(stack: LocalStack, run_id: int) -> list[int]:
    """Steps Orbax committed (a save in flight is a temporary directory with a suffix)."""
    directory = stack.config.var_dir / "checkpoints" / f"run-{run_id}"
    return sorted(int(path.name) for path in directory.iterdir() if path.name.isdigit())


@pytest.mark.timeout(2300)
def test_two_trainer_processes_train_one_run_over_one_mesh_and_resume_it_exactly(tmp_path):
    with multi_host_stack(tmp_path, producer_hosts=("host-b",), extra_hosts=(FOLLOWER_HOST,), log_lines=40,
                          extra_env={"TANDEM_TRAINER_HEARTBEAT_TIMEOUT_S": "10",
                                     "TANDEM_REAPER_INTERVAL_S": "1"}) as (stack, _):
        credentials = stack.prepare()
        stack.start_web()
        stack.start_platform_worker()
        stack.start_workers()
        hosts = (stack.net[TRAINER_HOST], stack.net[FOLLOWER_HOST])
        trainer = TwoProcessTrainer(stack, credentials, hosts)
        leader, follower = trainer.start()
        api = user_api(stack, credentials)
        created = api.post("/api/runs/", json={"project": credentials.project_id, "name": "two processes",
                                               "environment": "calculator", "config": RUN_CONFIG})
        assert created.status_code == 201, created.text
        run_id = created.json()["id"]

        # Killed once a checkpoint of an RL step is committed (the platform lists only committed
        # ones) and before the run ends: both processes at once, as a lost job would go.
        def rl_checkpoint() -> list[int] | None:
            steps = [step for step in _checkpoint_steps(api, run_id) if step > SFT_STEPS]
            return steps or None

        poll_until(rl_checkpoint, timeout_s=900, interval_s=0.5, between=stack.check_alive,
                   what=lambda: f"an RL checkpoint: {api.get(f'/api/runs/{run_id}/').json()}")
        assert api.get(f"/api/runs/{run_id}/").json()["status"] == "running"
        trainer.kill()
        committed = _committed_on_disk(stack, run_id)
        first_metrics = [trainer.metrics(process_id, attempt=1) for process_id in (0, 1)]

        # One trainer claimed the run: process 0, by its host and pid; process 1 never talked to the platform.
        run = api.get(f"/api/runs/{run_id}/").json()
        assert [attempt["trainer"] for attempt in run["attempt_history"]] == [f"{TRAINER_HOST}:{leader.pid}"]
        assert f"of 2 on host {FOLLOWER_HOST} follows process 0" in trainer.log(1, attempt=1)
        assert "claimed run" not in trainer.log(1, attempt=1)
        # Both processes trained every step up to the checkpoint and beyond, and computed the same
        # loss for each (the kill may fall between the two processes' lines of the last step).
        both = set(first_metrics[0]) & set(first_metrics[1])
        assert {step: first_metrics[0][step] for step in both} == {step: first_metrics[1][step] for step in both}
        assert sorted(first_metrics[0]) == list(range(1, max(first_metrics[0]) + 1))
        assert set(range(1, committed[-1] + 1)) <= both and committed[-1] > SFT_STEPS

        # The reaper queues the silent run again; both processes start again and resume it.
        poll_until(lambda: api.get(f"/api/runs/{run_id}/").json()["restarts"] == 1, timeout_s=120,
                   what="the reaper to restart the run", between=stack.check_alive)
        trainer.start()
        run = run_ended(stack, api, run_id, timeout_s=900)
        assert run["status"] == "finished", run["status_reason"]
        assert run["attempts"] == 2 and run["trainer_step"] == SFT_STEPS + RL_STEPS
        assert [attempt["outcome"] for attempt in run["attempt_history"]] == ["queued", "finished"]
        assert run["attempt_history"][1]["trainer"] == f"{TRAINER_HOST}:{stack.processes[trainer.log_name(0)].pid}"

        # Exactly from the newest committed checkpoint: both processes restored it, and the first
        # step they trained after it is the next one.
        resumed_from = committed[-1]
        assert f"resumes from its checkpoint of step {resumed_from} " in trainer.log(0)
        assert f"process 1 restored run {run_id} at step {resumed_from}" in trainer.log(1)
        second_metrics = [trainer.metrics(process_id, attempt=2) for process_id in (0, 1)]
        assert second_metrics[0] == second_metrics[1]
        assert sorted(second_metrics[0]) == list(range(resumed_from + 1, SFT_STEPS + RL_STEPS + 1))
        # The checkpoints the run kept are listed, the last one the final step's.
        assert _checkpoint_steps(api, run_id)[-1] == SFT_STEPS + RL_STEPS


@pytest.mark.timeout(2400)
def test_a_followers_death_sends_the_run_back_to_the_queue_and_both_processes_resume_it_exactly(tmp_path):
    """Process 1 is SIGKILLed after an RL checkpoint: process 0 queues the run again as a restart
    (counted against max_restarts) and exits, and the job started again resumes from the checkpoint."""
    config = {**RUN_CONFIG, "max_restarts": 2}
    # The reaper's timeout as deployed: the run goes back to the queue through the leader, which
    # lives on (beating) until it released the run, never through a reaper's presumption. The leader
    # learns of the death at its next collective or, when Gloo's all-reduce waits on the dead process
    # for good, from its watch on the follower's beats (a third of the JAX job's heartbeat timeout);
    # the timeout is longer than deployed (30 s) so that on a loaded host the coordination service
    # cannot end the leader before the watch has given the run back.
    with multi_host_stack(tmp_path, producer_hosts=("host-b",), extra_hosts=(FOLLOWER_HOST,), log_lines=40,
                          extra_env={"TANDEM_REAPER_INTERVAL_S": "1",
                                     "TANDEM_DISTRIBUTED_HEARTBEAT_TIMEOUT_S": "60"}) as (stack, _):
        credentials = stack.prepare()
        stack.start_web()
        stack.start_platform_worker()
        stack.start_workers()
        trainer = TwoProcessTrainer(stack, credentials, (stack.net[TRAINER_HOST], stack.net[FOLLOWER_HOST]))
        leader, _ = trainer.start()
        api = user_api(stack, credentials)
        created = api.post("/api/runs/", json={"project": credentials.project_id, "name": "a follower dies",
                                               "environment": "calculator", "config": config})
        assert created.status_code == 201, created.text
        run_id = created.json()["id"]
        poll_until(lambda: [step for step in _checkpoint_steps(api, run_id) if step > SFT_STEPS] or None,
                   timeout_s=900, interval_s=0.5, between=stack.check_alive,
                   what=lambda: f"an RL checkpoint: {api.get(f'/api/runs/{run_id}/').json()}")
        assert api.get(f"/api/runs/{run_id}/").json()["status"] == "running"

        trainer.kill(process_ids=(1,))
        # The leader learns of it (a collective fails, or the follower's beats stop), lets go of the run
        # and exits (a JAX job cannot lose a process and go on); the web server and workers live on.
        leader_name = trainer.log_name(0)
        others = [name for name in stack.processes if name != leader_name]

        def others_alive() -> None:
            for name in others:
                assert stack.processes[name].poll() is None, f"{name} exited"

        poll_until(lambda: leader.poll() is not None, timeout_s=300, interval_s=0.5, between=others_alive,
                   what=lambda: f"process 0 to exit: {api.get(f'/api/runs/{run_id}/').json()}")
        stack.processes.pop(leader_name)
        leader_log = trainer.log(0)

        # Back in the queue, and nothing trains it meanwhile: it stays there, for the test to read.
        run = api.get(f"/api/runs/{run_id}/").json()
        assert run["status"] == "queued", (run["status"], run["status_reason"])
        assert run["restarts"] == 1
        [attempt] = run["attempt_history"]
        assert attempt["outcome"] == "queued" and attempt["trainer"] == f"{TRAINER_HOST}:{leader.pid}"
        assert "lost a process of its JAX job" in attempt["reason"], attempt["reason"]
        assert "restart 1 of 2" in attempt["reason"], attempt["reason"]
        assert leader.returncode == LOST_PROCESS_EXIT_CODE, leader_log[-3000:]
        committed = _committed_on_disk(stack, run_id)
        assert committed[-1] > SFT_STEPS

        trainer.start()
        run = run_ended(stack, api, run_id, timeout_s=900)
        assert run["status"] == "finished", run["status_reason"]
        assert run["attempts"] == 2 and run["restarts"] == 1 and run["trainer_step"] == SFT_STEPS + RL_STEPS
        assert [attempt["outcome"] for attempt in run["attempt_history"]] == ["queued", "finished"]
        # Exactly from the newest committed checkpoint, on both processes.
        resumed_from = committed[-1]
        assert f"resumes from its checkpoint of step {resumed_from} " in trainer.log(0)
        assert f"process 1 restored run {run_id} at step {resumed_from}" in trainer.log(1)
        second_metrics = [trainer.metrics(process_id, attempt=2) for process_id in (0, 1)]
        assert second_metrics[0] == second_metrics[1]
        assert sorted(second_metrics[0]) == list(range(resumed_from + 1, SFT_STEPS + RL_STEPS + 1))
