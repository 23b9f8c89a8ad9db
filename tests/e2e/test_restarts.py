"""The stack survives its own restarts (issue 15, finding 7), with real processes throughout.

- Redis restarted mid-run, with persistence on: the run finishes, no trajectory it trained is
  lost and none is trained twice.
- The web server restarted mid-run: the trainer keeps training, buffers its step events while
  the platform is away, and the run finishes with every step's telemetry recorded.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import redis

from tandem.cli.stack import LocalStack, StackConfig
from tandem.contracts import LineageEntry, lineage_stream
from tandem.runtime.local_ports import free_local_port
from tests.e2e.conftest import fresh_database, print_log_tails, private_stack, user_api
from tests.polling import poll_until
from tests.redis_servers import PERSISTENT, start_redis_server

SFT_STEPS, RL_STEPS, GROUP_SIZE, GROUPS_PER_STEP = 2, 16, 4, 2
RUN_CONFIG = {
    "sft_steps": SFT_STEPS, "rl_steps": RL_STEPS, "checkpoint": {"every": 4},
    "rollout": {"group_size": GROUP_SIZE, "groups_per_step": GROUPS_PER_STEP, "groups_per_task": 1, "timeout_s": 60},
}


def _lineage(client: redis.Redis, run_id: int) -> list[LineageEntry]:
    return [LineageEntry.from_stream_fields(fields) for _, fields in client.xrange(lineage_stream(run_id))]


def _trained_steps(client: redis.Redis, run_id: int) -> int:
    return len({entry.step for entry in _lineage(client, run_id) if entry.kind == "trained"})


def _wait(predicate, *, timeout_s: float, what: str, stack: LocalStack, allowed_down: set[str] = frozenset(),
          supervised: bool = False):
    """Poll ``predicate``; a process that dies fails the test, unless ``supervised``: then it is
    restarted, as ``tandem up`` (and compose's restart policies) restart it."""

    def check() -> None:
        if supervised:
            stack.supervise()
            return
        for name, process in stack.processes.items():
            assert name in allowed_down or process.poll() is None, f"{name} died"

    poll_until(predicate, timeout_s=timeout_s, what=what, between=check, ignoring=(redis.ConnectionError,))


def _failed_liveness_beats(stack: LocalStack) -> int:
    """The trainer's liveness heartbeats that found no platform, as its log records them (trainer/main.py)."""
    return (stack.log_dir / "trainer.log").read_text(errors="replace").count("liveness heartbeat of run")


def _assert_every_step_trained_once(client: redis.Redis, run_id: int) -> None:
    final: dict[int, LineageEntry] = {}
    for entry in _lineage(client, run_id):
        if entry.kind == "trained":
            final[entry.step] = entry  # a step trained again (after a resume) survives as its newest
    assert sorted(final) == list(range(SFT_STEPS + 1, SFT_STEPS + RL_STEPS + 1))
    trained = [trajectory for entry in final.values() for trajectory in entry.trajectory_ids]
    assert len(trained) == len(set(trained)) == RL_STEPS * GROUPS_PER_STEP * GROUP_SIZE


class PersistentRedis:
    """A redis-server of this test's own, with an append-only file fsynced on every write."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.port = free_local_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = start_redis_server(self.port, self.directory, *PERSISTENT)

    def kill(self) -> None:
        self.process.kill()
        self.process.wait(timeout=10)


@pytest.fixture
def persistent_redis(tmp_path):
    server = PersistentRedis(tmp_path)
    server.start()
    yield server
    if server.process.poll() is None:
        server.kill()


@pytest.mark.timeout(1100)  # above its inner waits (tests/test_timeouts.py)
def test_a_run_survives_a_redis_restart_and_trains_every_trajectory_exactly_once(tmp_path, persistent_redis):
    """Before, a Redis error was handled nowhere: the trainer and the producers' tasks died with it."""
    with fresh_database() as database_url:
        stack = LocalStack(StackConfig(redis_url=persistent_redis.url, database_url=database_url,
                                       port=free_local_port(), workers=2, var_dir=tmp_path / "stack"))
        try:
            credentials = stack.prepare()
            stack.start(credentials)
            api = user_api(stack, credentials)
            created = api.post("/api/runs/", json={"project": credentials.project_id, "name": "redis restart",
                                                   "environment": "calculator", "config": RUN_CONFIG})
            assert created.status_code == 201, created.text
            run_id = created.json()["id"]
            client = redis.Redis.from_url(persistent_redis.url)
            _wait(lambda: _trained_steps(client, run_id) >= 4, timeout_s=300, what="four RL steps", stack=stack)
            client.close()

            # Killed, as a crash would; down for a few seconds; back on its append-only file.
            persistent_redis.kill()
            time.sleep(3)
            persistent_redis.start()

            client = redis.Redis.from_url(persistent_redis.url)
            # Supervised: a Celery worker of the threads pool can exit when a task's late ack meets
            # the connection Redis dropped (kombu's Redis transport); it is restarted, and the
            # groups its task never delivered are counted lost and requested again.
            _wait(lambda: api.get(f"/api/runs/{run_id}/").json()["status"] in {"finished", "failed", "cancelled"},
                  timeout_s=500, what="the run to end", stack=stack, supervised=True)
            run = api.get(f"/api/runs/{run_id}/").json()
            assert run["status"] == "finished", run["status_reason"]
            assert run["trainer_step"] == SFT_STEPS + RL_STEPS and run["attempts"] == 1
            _assert_every_step_trained_once(client, run_id)
            trainer_log = (stack.log_dir / "trainer.log").read_text(errors="replace")
            assert "unreachable" in trainer_log, "the trainer never saw Redis go away: the test restarted nothing"
            client.close()
        finally:
            stack.stop()
            print_log_tails(stack, lines=30)


@pytest.mark.timeout(1300)  # above its inner waits (tests/test_timeouts.py)
def test_a_run_survives_a_web_server_restart_and_keeps_every_steps_telemetry(tmp_path):
    """Before, the trainer exited after about 15 s without the platform, and lost the events it held."""
    with private_stack(tmp_path, log_lines=30) as stack:
        credentials = stack.prepare()
        stack.start(credentials)
        api = user_api(stack, credentials)
        config = {**RUN_CONFIG, "rl_steps": RL_STEPS * 2}
        run_id = api.post("/api/runs/", json={"project": credentials.project_id, "name": "web restart",
                                              "environment": "calculator", "config": config}).json()["id"]
        client = redis.Redis.from_url(stack.config.redis_url)
        _wait(lambda: _trained_steps(client, run_id) >= 3, timeout_s=300, what="three RL steps", stack=stack)

        web = stack.processes["web"]
        web.terminate()
        web.wait(timeout=30)
        steps_when_down, beats_failed_before = _trained_steps(client, run_id), _failed_liveness_beats(stack)

        # Down while the trainer trains a few more steps, which it goes on doing, and until its
        # liveness thread, which beats every 2 s whatever the loop does, has missed 10 beats: the
        # outage outlasts the old trainer's 5 retries (0.5 + 1 + ... + 8 s), after which it failed the run.
        def trained_through_the_outage() -> bool:
            return (_trained_steps(client, run_id) >= steps_when_down + 3
                    and _failed_liveness_beats(stack) >= beats_failed_before + 10)

        _wait(trained_through_the_outage, timeout_s=180, what="the trainer to train on while the platform is down",
              stack=stack, allowed_down={"web"})
        stack.start_web()

        _wait(lambda: api.get(f"/api/runs/{run_id}/").json()["status"] in {"finished", "failed", "cancelled"},
              timeout_s=400, what="the run to end", stack=stack)
        run = api.get(f"/api/runs/{run_id}/").json()
        assert run["status"] == "finished", run["status_reason"]
        total = SFT_STEPS + RL_STEPS * 2
        assert run["trainer_step"] == total and run["attempts"] == 1
        # The events of the steps trained while the platform was away arrived once it was back.
        points = api.get(f"/api/runs/{run_id}/metrics/", params={"after_step": -1, "names": "loss"}).json()["points"]
        assert sorted(point["step"] for point in points) == list(range(1, total + 1))
        client.close()
