"""One real asynchronous run, from the REST API through producers and trainer, and back."""

from __future__ import annotations

import io
import json
import threading
import time
import zipfile

import httpx
import pytest
import redis
from websockets.sync.client import connect

from tandem.contracts import PADDING_FRACTION_METRIC, TRAINER_CONSUMER_GROUP, trajectory_stream
from tests.e2e.conftest import StreamObserver

SMALL_RUN = {
    "sft_steps": 120,
    "rl_steps": 4,
    "rollout": {"groups_per_step": 2, "group_size": 4, "groups_per_task": 1},
    "checkpoint": {"every": 2},
    # Its RL steps pack their episodes several to a row (trainer/train_batch.py's pack_batch).
    "memory": {"pack_episodes": True},
}
EPISODES_PER_STEP = SMALL_RUN["rollout"]["groups_per_step"] * SMALL_RUN["rollout"]["group_size"]


def _client(stack, credentials) -> httpx.Client:
    return httpx.Client(
        base_url=stack.config.platform_url,
        headers={"Authorization": f"Token {credentials.user_token}"},
        timeout=10,
    )


def _wait_for_status(client, run_id, statuses, timeout_s):
    deadline = time.monotonic() + timeout_s
    run = None
    while time.monotonic() < deadline:
        run = client.get(f"/api/runs/{run_id}/").json()
        if run["status"] in statuses:
            return run
        time.sleep(1)
    raise AssertionError(f"run {run_id} did not reach {statuses} in {timeout_s}s; last seen {run}")


class _WebSocketListener(threading.Thread):
    def __init__(self, url, token):
        super().__init__(daemon=True)
        self.url, self.token = url, token
        self.messages: list[dict] = []
        self.connected = threading.Event()
        self.stop = threading.Event()

    def run(self):
        with connect(self.url, additional_headers={"Authorization": f"Token {self.token}"}) as ws:
            self.connected.set()
            while not self.stop.is_set():
                try:
                    self.messages.append(json.loads(ws.recv(timeout=0.5)))
                except TimeoutError:
                    continue


def test_a_run_trains_end_to_end_through_stream_trainer_and_platform(stack, credentials):
    local, _ = stack
    client = _client(local, credentials)
    response = client.post("/api/runs/", json={
        "project": credentials.project_id, "name": "e2e", "environment": "calculator", "config": SMALL_RUN,
    })
    assert response.status_code == 201, response.text
    run_id = response.json()["id"]

    observer = StreamObserver(local.config.redis_url, trajectory_stream(run_id))
    observer.start()
    ws_url = local.config.platform_url.replace("http", "ws") + f"/ws/runs/{run_id}/"
    listener = _WebSocketListener(ws_url, credentials.user_token)
    listener.start()
    assert listener.connected.wait(10), "WebSocket did not connect"

    run = _wait_for_status(client, run_id, {"finished", "failed", "cancelled"}, timeout_s=420)
    local.check_alive()
    assert run["status"] == "finished", run
    listener.stop.set()
    observer.stop.set()
    listener.join(5)
    observer.join(5)

    # Trajectories went through the stream, and every one the trainer read was acknowledged.
    r = redis.Redis.from_url(local.config.redis_url)
    stream = trajectory_stream(run_id)
    (group_info,) = [g for g in r.xinfo_groups(stream) if g["name"].decode() == TRAINER_CONSUMER_GROUP]
    trained = SMALL_RUN["rl_steps"] * EPISODES_PER_STEP
    records = observer.records
    assert len(records) >= trained
    assert group_info["entries-read"] >= trained
    assert group_info["pending"] == 0
    # Acknowledged entries are trimmed away; what is left was never acknowledged.
    assert r.xlen(stream) < len(records)

    # The policy version advanced, and later trajectories came from a newer policy.
    assert run["policy_version"] == SMALL_RUN["rl_steps"]
    versions = {record.policy_version for record in records}
    assert 0 in versions and max(versions) >= 1, versions
    assert all(sum(record.loss_mask) > 0 for record in records if record.status == "ok")

    # Metrics arrived over REST, paged by the step cursor ...
    points, after = [], -1
    while True:
        page = client.get(f"/api/runs/{run_id}/metrics/", params={"after_step": after, "limit": 200}).json()
        if not page["points"]:
            break
        points += page["points"]
        after = page["next_after_step"]
    names = {p["name"] for p in points}
    assert {"loss", "reward_mean", "trainer_idle_fraction", "staleness_mean", "samples_per_s"} <= names
    # The loss's own statistics are logged too (clipping, entropy, gradient norm).
    assert {"algorithm/clip_fraction", "algorithm/entropy", "algorithm/grad_norm"} <= names
    # Rollout latency percentiles and error rates per environment, and produced against consumed.
    assert {"rollout/calculator/latency_p90_s", "rollout/calculator/environment_p99_s",
            "rollout/calculator/error_rate", "samples_produced_per_s", "samples_per_s"} <= names
    # Staleness arrives as a histogram (total, in queue, in flight) and a drop rate.
    assert any(name.startswith("staleness/total/") for name in names)
    assert {"staleness/stale_drop_rate", "staleness/queue_wait_s_mean"} <= names
    steps = sorted({p["step"] for p in points})
    assert steps == list(range(1, SMALL_RUN["sft_steps"] + SMALL_RUN["rl_steps"] + 1))
    # Profiling: every RL step's stages add up to its wall time, waiting for data among them; and
    # producers said where their time went (generation, environment, tools, stream appends).
    rl_steps = [step for step in steps if step > SMALL_RUN["sft_steps"]]
    for step in rl_steps:
        values = {p["name"]: p["value"] for p in points if p["step"] == step}
        stages = {name: value for name, value in values.items() if name.startswith("stage/")}
        assert {"stage/data_wait_s", "stage/compute_s", "stage/publish_s"} <= stages.keys(), stages
        assert sum(stages.values()) == pytest.approx(values["wall_s"], rel=1e-6, abs=1e-6)
        assert values["trainer_idle_fraction"] == pytest.approx(values["stage/data_wait_s"] / values["wall_s"])
    assert {"trainer_utilisation", "device/count", "producers/generation_share", "producers/environment_share",
            "producers/tool_share", "producers/stream_put_share", "producers/stream_put_s",
            "producers/cpu_cores", "producers/rss_bytes"} <= names
    # Each packed RL step says how much of its batch was padding.
    padding = {p["step"]: p["value"] for p in points if p["name"] == PADDING_FRACTION_METRIC}
    assert set(rl_steps) <= padding.keys() and all(0.0 <= padding[step] < 1.0 for step in rl_steps), padding
    shares = [p["value"] for p in points if p["name"].endswith("_share") and p["name"].startswith("producers/")]
    assert all(0.0 <= share <= 1.0 for share in shares)
    assert max(p["value"] for p in points if p["name"] == "producers/generation_share") > 0

    # ... and over the WebSocket, live.
    live = [m for m in listener.messages if m.get("type") == "metrics"]
    assert live, f"no metrics over the WebSocket; got {listener.messages[:3]}"
    assert max(m["step"] for m in live) == steps[-1]
    assert any("reward_mean" in m["values"] for m in live)

    # The timeline has every step's stages, and every episode each RL step consumed: each came
    # through the stream, and ended before the trainer stopped waiting for it.
    timeline = client.get(f"/api/runs/{run_id}/timeline/", params={"last": 200}).json()
    assert [step["step"] for step in timeline["steps"]] == steps
    streamed = {record.trajectory_id: record for record in records}
    for step in timeline["steps"]:
        assert step["stages"][0]["started_at"] == step["started_at"]
        assert step["stages"][-1]["ended_at"] == step["ended_at"]
        if step["phase"] == "sft":
            assert step["episodes"] == []
            continue
        used = [e for e in step["episodes"] if e["outcome"] in {"trained", "failed", "dropped_filtered"}]
        assert len(used) >= EPISODES_PER_STEP, step["episodes"]
        waited_until = max(stage["ended_at"] for stage in step["stages"] if stage["name"] == "data_wait")
        for episode in step["episodes"]:
            record = streamed[episode["trajectory_id"]]
            assert (episode["group_id"], episode["status"], episode["started_at"]) == (
                record.group_id, record.status, record.timings.started_at)
            assert episode["outcome"] != "failed" or episode["status"] == "failed"
            assert episode["finished_at"] <= waited_until + 0.01
    consumed = [e["trajectory_id"] for step in timeline["steps"] for e in step["episodes"]]
    assert len(consumed) == len(set(consumed))  # each in the step that consumed it, once
    assert sum(e["outcome"] == "trained" for step in timeline["steps"] for e in step["episodes"]) > 0

    # The trainer sent a few trajectories of every RL step to the trajectory browser.
    samples = client.get(f"/api/runs/{run_id}/trajectories/", params={"page_size": 200}).json()
    rl_steps = range(SMALL_RUN["sft_steps"] + 1, SMALL_RUN["sft_steps"] + SMALL_RUN["rl_steps"] + 1)
    assert {sample["step"] for sample in samples["results"]} == set(rl_steps), samples
    assert all(sample["environment"] == "calculator" for sample in samples["results"])
    # The best episode of a step, sent as "best", or as a member of a whole sampled group ("group").
    assert {sample["selected_because"] for sample in samples["results"]} & {"best", "group"}
    best = max((sample for sample in samples["results"] if sample["status"] != "failed"),
               key=lambda sample: sample["reward"])
    detail = client.get(best["url"]).json()
    assert detail["turns"][0]["role"] == "prompt" and detail["turns"][1]["role"] == "policy"
    trained = sum(span["tokens"] for turn in detail["turns"] for span in turn["spans"] if span["trained"])
    assert trained == detail["trained_tokens"] > 0
    assert all(span["trained"] for turn in detail["turns"] if turn["role"] == "policy" for span in turn["spans"])
    assert len(detail["policy_versions"]) == detail["num_turns"] >= 1

    # Orbax wrote checkpoints for the run.
    checkpoint_dir = local.config.var_dir / "checkpoints" / f"run-{run_id}"
    on_disk = sorted(int(path.name) for path in checkpoint_dir.iterdir() if path.name.isdigit())
    assert on_disk[-1] == steps[-1]
    # The trainer reported them: what retention (checkpoint.kept, 3) left is listed available,
    # the older ones it had reported are marked deleted by retention.
    listed = client.get(f"/api/runs/{run_id}/checkpoints/?page_size=100").json()["results"]
    assert sorted(c["step"] for c in listed if c["status"] == "available") == on_disk == on_disk[-3:]
    assert {c["deleted_reason"] for c in listed if c["status"] == "deleted"} == {"retention"}
    # The export worker (trainer/export_worker.py) exports the newest to safetensors.
    newest = on_disk[-1]
    assert client.post(f"/api/runs/{run_id}/checkpoints/{newest}/export/").status_code == 202
    deadline = time.monotonic() + 120
    while (checkpoint := client.get(f"/api/runs/{run_id}/checkpoints/{newest}/").json())["export_status"] == "exporting":
        assert time.monotonic() < deadline, checkpoint
        time.sleep(0.5)
    assert checkpoint["export_status"] == "exported", checkpoint
    download = client.get(f"/api/runs/{run_id}/checkpoints/{newest}/download/")
    assert download.status_code == 200, download.text
    with zipfile.ZipFile(io.BytesIO(download.content)) as archive:
        assert sorted(archive.namelist()) == ["config.json", "model.safetensors"]


def test_bad_input_over_the_live_api_names_the_field(stack, credentials):
    local, _ = stack
    client = _client(local, credentials)
    bad = client.post("/api/runs/", json={
        "project": credentials.project_id, "environment": "no-such-env", "config": {},
    })
    assert bad.status_code == 400 and "environment" in bad.json()["error"]["fields"]
    bad = client.post("/api/runs/", json={
        "project": credentials.project_id, "environment": "calculator", "config": {"rollout": {"group_size": 1}},
    })
    assert bad.status_code == 400 and "config.rollout.group_size" in bad.json()["error"]["fields"]
