"""Two real producer processes against a server that serves only N episodes at once.

The run asks for 3N episodes of an HTTP environment registered with
``max_concurrent_episodes=N`` (tests/workers/capacity_server.py refuses the
(N+1)-th open episode): every episode waits for a slot instead of failing.
"""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from flax import nnx

from policy.model import Transformer, TransformerConfig, split_model
from policy.tokenizer import VOCAB_SIZE
from policy.weights import RedisWeightPublisher
from tandem.configs.rollout import RolloutConfig, SamplingConfig
from tandem.configs.run import ModelConfig, RunConfig
from tandem.contracts import (
    EnvironmentSpec,
    RunSpec,
    TrajectoryRecord,
    environment_episode_slots_key,
    run_keys,
    run_spec_key,
    trajectory_stream,
)
from tests.conftest import REPO_ROOT

CAPACITY = 2
GROUP_SIZE = 3  # one group per producer: 2 x 3 = 3N episodes
STEP_S = 0.3
CONFIG = RunConfig(
    model=ModelConfig(d_model=32, num_layers=1, num_heads=2, mlp_dim=64, max_seq_len=128),
    rollout=RolloutConfig(group_size=GROUP_SIZE, max_turns=2, environment_timeout_s=10.0),
    sampling=SamplingConfig(max_new_tokens=8),
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


@pytest.fixture
def capacity_server():
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "tests.workers.capacity_server", "--port", str(port),
                               "--capacity", str(CAPACITY), "--step-s", str(STEP_S)], cwd=REPO_ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                _get_json(f"{url}/health")
                break
            except OSError:
                time.sleep(0.05)
        yield url
    finally:
        server.kill()
        server.wait(timeout=10)


def test_producers_hold_to_the_environments_limit_across_processes(redis_client, redis_url, run_id,
                                                                    capacity_server):
    version_id = random.randint(10**8, 10**9)
    model = Transformer(TransformerConfig.from_model_config(CONFIG.model, VOCAB_SIZE), rngs=nnx.Rngs(0))
    RedisWeightPublisher(redis_client).publish(run_id=run_id, version=1, params=split_model(model)[1])
    environment = EnvironmentSpec(name="capped", kind="http", version=1, version_id=version_id,
                                  settings={"url": capacity_server}, max_concurrent_episodes=CAPACITY)
    redis_client.set(run_spec_key(run_id), RunSpec(run_id=run_id, config=CONFIG, environment=environment)
                     .model_dump_json())
    barrier = f"tandem:test:{run_id}:producers_ready"
    try:
        producers = [
            subprocess.Popen([sys.executable, "-m", "tests.workers.capped_producer", redis_url, str(run_id),
                              str(group), "1", barrier, "2"], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
            for group in range(2)
        ]
        outputs = [producer.communicate(timeout=300)[0] for producer in producers]
        assert [producer.returncode for producer in producers] == [0, 0]
        summaries = [json.loads(output.strip().splitlines()[-1]) for output in outputs]
        records = [TrajectoryRecord.from_stream_fields(fields)
                   for _, fields in redis_client.xrange(trajectory_stream(run_id))]
        stats = _get_json(f"{capacity_server}/stats")
        slots_left = redis_client.zcard(environment_episode_slots_key(version_id))
    finally:
        redis_client.delete(barrier, environment_episode_slots_key(version_id), *run_keys(run_id))

    assert [(s["episodes"], s["failed"]) for s in summaries] == [(GROUP_SIZE, 0), (GROUP_SIZE, 0)]
    assert len(records) == 2 * GROUP_SIZE
    assert all(record.status == "ok" for record in records), [record.failure_reason for record in records]
    # The two producers ran at the same time, and the server never saw more than N episodes open.
    first, second = summaries
    assert first["began"] < second["ended"] and second["began"] < first["ended"]
    assert stats["refused"] == 0 and stats["episodes"] == 2 * GROUP_SIZE
    assert stats["peak"] <= CAPACITY
    # Each producer has more episodes than slots: some waited at least one episode's step.
    assert max(record.timings.slot_wait_s for record in records) >= STEP_S
    assert slots_left == 0  # every slot was given back
