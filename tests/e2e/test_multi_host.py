"""Tandem on four hosts of network namespaces: the platform and Redis on A, producers on B and C, the trainer on D.

Every process reaches the others over the test network only: B and C see
none of the trainer's files (its directory is hidden behind a tmpfs there),
and users reach the platform from the outside. Three runs share the stack:

- a run finishes, trained on episodes that B and C made with weights that
  reached them over Redis;
- a run with the filesystem weight transport fails at once, naming the
  directory and the hosts, because B and C do not share the trainer's storage;
- a run survives B's cable being pulled while B has episodes in flight: they
  are counted lost and made again on C, where the run finishes. Every
  trajectory id appended to the stream is accounted for: trained once,
  dropped, part of a group counted lost, or left in the stream after the end.
  With B's cable back (and C's pulled, so that only B can), B's worker takes
  the next run's work, the same process, never restarted.
"""

from __future__ import annotations

import threading

import httpx
import pytest
import redis

from tandem.contracts import (
    LineageEntry,
    ProducerReport,
    TrajectoryRecord,
    lineage_stream,
    producers_key,
    trajectory_stream,
    weights_key,
)
from tests.e2e.conftest import run_ended, user_api
from tests.e2e.multi_host import TRAINER_HOST, multi_host_stack
from tests.polling import poll_until

# One environment step or tool call takes this long: an episode lasts seconds, so one is in
# flight whenever a producer holds a task, and the runs' pace is bounded by it on any machine.
ENVIRONMENT_LATENCY_MS = 1000
ROLLOUT = {"groups_per_step": 2, "group_size": 2, "groups_per_task": 1, "max_turns": 2}
RL_STEPS_CUT_OFF = 40


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    with multi_host_stack(tmp_path_factory.mktemp("multi-host"), worker_concurrency=2,
                          environment_latency_ms=ENVIRONMENT_LATENCY_MS) as (stack, environment_url):
        credentials = stack.prepare()
        stack.start(credentials)
        api = user_api(stack, credentials)
        api.post("/api/environments/", json={
            "project": credentials.project_id, "name": "calculator-on-host-a", "kind": "http",
            "settings": {"url": environment_url, "timeout_s": 60},
            "tools": httpx.get(f"{environment_url}/schema").json()["tools"],
        }).raise_for_status()
        yield stack, credentials, api
        api.close()


class StreamRecorder(threading.Thread):
    """Every entry appended to a run's trajectory stream, read as it arrives (before any trim)."""

    def __init__(self, redis_url: str, run_id: int):
        super().__init__(daemon=True)
        self._client = redis.Redis.from_url(redis_url)
        self._stream = trajectory_stream(run_id)
        self.entries: list[tuple[str, TrajectoryRecord]] = []
        self._stopping = threading.Event()

    def run(self) -> None:
        last_id = "0-0"
        while not self._stopping.is_set():
            for _, entries in self._client.xread({self._stream: last_id}, block=200) or []:
                for entry_id, fields in entries:
                    last_id = entry_id.decode()
                    self.entries.append((last_id, TrajectoryRecord.from_stream_fields(fields)))

    def __enter__(self) -> StreamRecorder:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stopping.set()
        self.join(timeout=10)
        self._client.close()


def _create_run(api: httpx.Client, project_id: int, name: str, config: dict) -> int:
    created = api.post("/api/runs/", json={"project": project_id, "name": name,
                                           "environment": "calculator-on-host-a", "config": config})
    assert created.status_code == 201, created.text
    return created.json()["id"]


def _lineage(client: redis.Redis, run_id: int) -> list[LineageEntry]:
    return [LineageEntry.from_stream_fields(fields) for _, fields in client.xrange(lineage_stream(run_id))]


def _host(producer: str) -> str:
    return producer.split(":")[0]


@pytest.mark.timeout(900)  # above its inner waits (tests/test_timeouts.py)
def test_a_run_created_from_outside_finishes_on_producers_that_get_its_weights_over_the_network(hosts):
    stack, credentials, api = hosts
    client = redis.Redis.from_url(stack.config.redis_url)
    run_id = _create_run(api, credentials.project_id, "four hosts",
                         {"sft_steps": 0, "rl_steps": 4, "rollout": ROLLOUT})
    with StreamRecorder(stack.config.redis_url, run_id) as recorder:
        run = run_ended(stack, api, run_id, timeout_s=600)
    assert run["status"] == "finished", run["status_reason"]
    assert run["trainer_step"] == 4
    assert {_host(attempt["trainer"]) for attempt in run["attempt_history"]} == {TRAINER_HOST}

    records = [record for _, record in recorder.entries]
    assert records and {_host(record.producer) for record in records} <= {"host-b", "host-c"}
    # Producers made episodes with policies the trainer published after its first update:
    # versions that could only have come over Redis (host-d's files are not on B or C).
    assert max(record.newest_version() for record in records) >= 1
    assert client.hget(weights_key(run_id), "path") is None
    trained = [trajectory for entry in _lineage(client, run_id) if entry.kind == "trained"
               for trajectory in entry.trajectory_ids]
    assert len(trained) == len(set(trained)) == 4 * ROLLOUT["groups_per_step"] * ROLLOUT["group_size"]
    client.close()


def test_filesystem_weights_on_hosts_that_do_not_share_the_path_fail_the_run_at_once_naming_it(hosts):
    stack, credentials, api = hosts
    run_id = _create_run(api, credentials.project_id, "filesystem weights, no shared storage", {
        "sft_steps": 0, "rl_steps": 4, "weights": {"transport": "filesystem"},
        # Were the episodes waited for until they count as lost, the run would take an hour.
        "rollout": {**ROLLOUT, "timeout_s": 3600},
    })
    # Bounded far below the rollout timeout: the run must fail, not wait for lost episodes.
    run = run_ended(stack, api, run_id, timeout_s=300)
    assert run["status"] == "failed", run
    reason = run["status_reason"]
    path = stack.config.var_dir / "checkpoints" / "weights" / f"run-{run_id}" / "v0"
    assert str(path.resolve()) in reason, reason
    assert f"host {TRAINER_HOST!r}" in reason, reason
    assert "producer host 'host-b'" in reason or "producer host 'host-c'" in reason, reason
    assert run["trainer_step"] == 0


@pytest.mark.timeout(3000)  # above its inner waits (tests/test_timeouts.py)
def test_a_partitioned_producer_loses_only_its_episodes_and_rejoins_when_its_link_is_back(hosts):
    stack, credentials, api = hosts
    net = stack.net
    host_b, host_c = net["host-b"], net["host-c"]
    client = redis.Redis.from_url(stack.config.redis_url)
    # The pace is bounded by the environment's latency: an episode waits 1 s at least (one
    # environment step), and each producer runs 2 tasks of one group at once, so C alone trains a
    # step a second at the very best, and the run outlasts rollout.timeout_s (20 s), after which
    # B's groups are counted lost.
    run_id = _create_run(api, credentials.project_id, "partition", {
        "sft_steps": 0, "rl_steps": RL_STEPS_CUT_OFF, "rollout": {**ROLLOUT, "timeout_s": 20}})
    with StreamRecorder(stack.config.redis_url, run_id) as recorder:
        def producer_running(host: str) -> ProducerReport | None:
            for field, value in client.hgetall(producers_key(run_id)).items():
                report = ProducerReport.model_validate_json(value)
                if _host(field.decode()) == host and report.running_tasks > 0:
                    return report
            return None

        # 1. B holds a task (its episodes wait seconds on the environment): pull its cable. The
        # versions published from then on cannot reach B until its cable is back.
        report_b = poll_until(lambda: producer_running("host-b"), timeout_s=300, interval_s=0.2,
                              between=stack.check_alive, what="host-b to run a rollout task")
        net.unplug(host_b)
        try:
            version_b_had = int(client.hget(weights_key(run_id), "version"))
            # Its groups are counted lost after rollout.timeout_s, asked for again, and the run finishes on C.
            run = run_ended(stack, api, run_id, timeout_s=1200)
        finally:
            net.plug(host_b)
    assert run["status"] == "finished", run["status_reason"]
    assert run["trainer_step"] == RL_STEPS_CUT_OFF

    lineage = _lineage(client, run_id)
    final = {entry.step: entry for entry in lineage if entry.kind == "trained"}
    by_id = {record.trajectory_id: record for _, record in recorder.entries}
    trained_records = [by_id[trajectory] for entry in final.values() for trajectory in entry.trajectory_ids]
    # B made nothing with a policy published after its cable was pulled: the rest is C's.
    assert all(record.newest_version() <= version_b_had for record in trained_records
               if _host(record.producer) == "host-b")
    assert {_host(record.producer) for record in trained_records
            if record.newest_version() > version_b_had} == {"host-c"}

    # Reconciled by id: every appended trajectory was trained once, dropped, in a group given up on,
    # or left in the stream after the end; nothing trained or dropped was never appended.
    appended = {record.trajectory_id: record.group_id for _, record in recorder.entries}
    trained = [trajectory for entry in final.values() for trajectory in entry.trajectory_ids]
    dropped = {trajectory for entry in lineage if entry.kind == "dropped" for trajectory in entry.trajectory_ids}
    lost = {group for entry in lineage if entry.kind == "lost" for group in entry.group_ids}
    assert lost, "no group was counted lost: the partition cut nothing off"
    assert len(trained) == len(set(trained)), "a trajectory was trained twice"
    assert sorted(final) == list(range(1, RL_STEPS_CUT_OFF + 1))
    assert not set(trained) & dropped
    assert set(trained) | dropped <= appended.keys()
    assert not lost & {appended[trajectory] for trajectory in set(trained) | dropped}
    left_in_stream = {TrajectoryRecord.from_stream_fields(fields).trajectory_id
                      for _, fields in client.xrange(trajectory_stream(run_id))}
    unaccounted = {trajectory for trajectory, group in appended.items()
                   if trajectory not in trained and trajectory not in dropped and group not in lost
                   and trajectory not in left_in_stream}
    assert not unaccounted, unaccounted

    # 2. B's cable is back. With C's pulled, a new run can only be made by B: its worker rejoined,
    # the same process (no restart), and takes work again.
    net.unplug(host_c)
    try:
        rejoin_run_id = _create_run(api, credentials.project_id, "after the partition",
                                    {"sft_steps": 0, "rl_steps": 2, "rollout": {**ROLLOUT, "timeout_s": 20}})
        with StreamRecorder(stack.config.redis_url, rejoin_run_id) as rejoin_recorder:
            rejoin_run = run_ended(stack, api, rejoin_run_id, timeout_s=1200)
    finally:
        net.plug(host_c)
    assert rejoin_run["status"] == "finished", rejoin_run["status_reason"]
    rejoin_lineage = _lineage(client, rejoin_run_id)
    by_id = {record.trajectory_id: record for _, record in rejoin_recorder.entries}
    assert {by_id[trajectory].producer for entry in rejoin_lineage if entry.kind == "trained"
            for trajectory in entry.trajectory_ids} == {report_b.worker}
    stack.check_alive()
    client.close()
