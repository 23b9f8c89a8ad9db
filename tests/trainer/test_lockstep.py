"""The leader's orders to the other processes of a multi-process trainer (trainer/lockstep.py).

Two processes need a JAX job of their own, which this pytest process (JAX
started, one device) cannot join: as in test_sharding.py, each test runs this
file as a script in fresh interpreters, which print one JSON line each.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
from jax.experimental import multihost_utils

from tandem.runtime.local_ports import free_local_port
from trainer.job_liveness import BEAT_S, FollowerWatch, follower_lapse_s
from trainer.lockstep import (
    FIRST_BLOCK_BYTES,
    LOST_PROCESS_EXIT_CODE,
    SINGLE_PROCESS,
    Order,
    OrderKind,
    arrays_batch,
    batch_arrays,
    decode,
    encode,
)
from trainer.train_batch import pack_batch, pad_batch

REPO_ROOT = Path(__file__).resolve().parents[2]
# The follower watch's lapse in the follower_dies children.
LAPSE_S = 5.0


def _batch(rows: int, length: int):
    rng = np.random.default_rng(rows * 1000 + length)
    sequences = [rng.integers(1, 64, size=length - 2).tolist() for _ in range(rows)]
    batch = pad_batch(sequences, loss_masks=[[0] + [1] * (length - 3)] * rows, behaviour_logprobs=None,
                      advantages=[0.5] * rows, batch_size=rows, length_buckets=(length,), pad_id=0)
    return batch.replace(extras={"reference_logprobs": rng.normal(size=(rows, length)).astype(np.float32)})


# Orders of every size class: empty, fields only, just under and just over the first block, and a
# batch of about 160 kB that takes a second block.
def _orders() -> list[Order]:
    return [
        Order(OrderKind.IDLE),
        Order(OrderKind.CHECKPOINT, {"step": 6, "progress": {"step": 6, "trained_group_ids": ["a", "b"]}}),
        Order(OrderKind.SCORE, {}, {"bytes": np.arange(FIRST_BLOCK_BYTES - 200, dtype=np.uint8)}),
        Order(OrderKind.SCORE, {}, {"bytes": np.arange(FIRST_BLOCK_BYTES, dtype=np.uint8)}),
        Order(OrderKind.TRAIN, {"phase": "rl", "step": 7, "learning_rate": 1e-5, "updates": 2},
              batch_arrays(_batch(16, 384))),
        Order(OrderKind.QUIT),
    ]


def _digest(order: Order) -> dict:
    return {"kind": str(order.kind), "fields": order.fields,
            "arrays": {name: [str(array.dtype), list(array.shape), array.tobytes().hex()[:64],
                              float(np.sum(array.astype(np.float64)))]
                       for name, array in sorted(order.arrays.items())}}


def _processes(role: str, port: int, *args: str) -> list[subprocess.Popen]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    return [subprocess.Popen([sys.executable, "-m", "tests.trainer.test_lockstep", role, str(process_id), str(port),
                              *args],
                             cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for process_id in (0, 1)]


def _report(stdout: str) -> dict:
    # Gloo writes progress lines to stdout; the report is the last line.
    return json.loads(stdout.strip().splitlines()[-1])


def test_orders_of_every_size_reach_the_follower_exactly():
    leader, follower = _processes("orders", free_local_port())
    reports = []
    for child in (leader, follower):
        stdout, stderr = child.communicate(timeout=180)
        assert child.returncode == 0, stderr[-4000:]
        reports.append(_report(stdout))
    expected = [_digest(decode(encode(order))) for order in _orders()]
    assert reports[0] == {"sent": len(expected)}
    assert reports[1]["received"] == expected


def test_a_follower_whose_leader_dies_exits_with_an_error_instead_of_waiting_forever():
    leader, follower = _processes("leader_dies", free_local_port())
    leader.communicate(timeout=180)
    assert leader.returncode == -signal.SIGKILL
    # Bounded by the broadcast failing (the leader's connection resets) or, at worst, by the
    # JAX job's heartbeat timeout (10 s here); never by this timeout.
    stdout, stderr = follower.communicate(timeout=120)
    assert follower.returncode != 0
    assert "received idle" in stdout, stderr[-4000:]


def test_a_follower_killed_while_the_leader_waits_in_a_collective_is_noticed_by_its_silence():
    """The follower beats, then is SIGKILLed while the leader waits for good (as in a Gloo all-reduce
    on CPU, which never fails): the leader's watch names the silent process once its beats lapse."""
    leader, follower = _processes("follower_dies", free_local_port())
    stdout, stderr = follower.communicate(timeout=180)
    assert follower.returncode == -signal.SIGKILL, stderr[-4000:]
    beats_before_death = int(stdout.split("dies after beats ", 1)[1].split()[0])
    stdout, stderr = leader.communicate(timeout=180)
    assert leader.returncode == LOST_PROCESS_EXIT_CODE, stderr[-4000:]
    report = json.loads(stdout.split("silent: ", 1)[1].splitlines()[0])
    assert report["process"] == 1
    # Silent since the death, never before it: the follower had beaten the whole time it lived, and the
    # watch acted only once it had seen every beat the follower made.
    assert beats_before_death >= 3
    assert report["beats_seen"] >= beats_before_death


def test_the_watch_counts_a_follower_silent_only_when_its_beats_stop_changing():
    now = [0.0]
    beats: dict[int, str] = {}
    watch = FollowerWatch([1, 2], lapse_s=5.0, on_silent=lambda *_: None, read=lambda: dict(beats),
                          clock=lambda: now[0])
    seen: dict = {}
    for second in range(1, 20):
        now[0] = float(second)
        beats = {1: str(second), 2: str(second)}  # both beat every second
        assert watch.check(seen) is None
    beats = {1: "19"}  # process 2 loses its key; process 1 stops beating
    now[0] = 23.0
    assert watch.check(seen) is None  # 1: 4 s silent; 2: its change (to nothing) is news
    now[0] = 24.0
    assert watch.check(seen) == (1, 5.0)
    # A follower that never beat counts as silent from the watch's first look.
    fresh: dict = {}
    never = FollowerWatch([1], lapse_s=5.0, on_silent=lambda *_: None, read=dict, clock=lambda: now[0])
    assert never.check(fresh) is None
    now[0] = 29.0
    assert never.check(fresh) == (1, 5.0)
    assert follower_lapse_s(30) == 10.0 and follower_lapse_s(3) == 5 * BEAT_S


def test_a_follower_obeys_every_order_of_a_run_and_computes_what_the_leader_computes(tmp_path):
    """SFT, the KL reference and its log-probabilities, held-out scoring, a checkpoint, a restore of it
    (with the reference) and an RL step with a learning rate that changes: the leader makes each call as
    RunTrainer makes it, the follower as FollowedRun does, and both log the same metrics for each step."""
    leader, follower = _processes("run", free_local_port(), str(tmp_path))
    reports = []
    for child in (leader, follower):
        stdout, stderr = child.communicate(timeout=300)
        assert child.returncode == 0, stderr[-4000:]
        reports.append((_report(stdout), stdout + stderr))
    (led, leader_log), (_, follower_log) = reports
    trained = [[line.split(" trained ", 1)[1] for line in log.splitlines() if " trained step " in line]
               for log in (leader_log, follower_log)]
    assert len(trained[0]) == 3 and trained[0] == trained[1], trained
    assert led["restored_step"] == 1 and led["scored_rows"] == 4
    assert "process 1 restored run 1 at step 1" in follower_log


def test_a_single_process_trainer_announces_nothing(monkeypatch):
    def no_broadcast(*args, **kwargs):
        raise AssertionError("a single process broadcast an order")

    monkeypatch.setattr(multihost_utils, "broadcast_one_to_all", no_broadcast)
    monkeypatch.setattr(multihost_utils, "process_allgather", no_broadcast)
    SINGLE_PROCESS.announce(OrderKind.START, {"run_id": 1})
    SINGLE_PROCESS.announce_batch(OrderKind.TRAIN, _batch(2, 32))
    SINGLE_PROCESS.keep_alive()
    assert SINGLE_PROCESS.agree(True) and not SINGLE_PROCESS.agree(False)


def test_a_batch_crosses_as_arrays_and_comes_back_the_same():
    batch = _batch(4, 48)
    again = arrays_batch(decode(encode(Order(OrderKind.TRAIN, {}, batch_arrays(batch)))).arrays)
    for name in ("tokens", "positions", "attention_mask", "loss_mask", "advantages", "behaviour_logprobs"):
        assert np.array_equal(np.asarray(getattr(again, name)), np.asarray(getattr(batch, name))), name
        assert np.asarray(getattr(again, name)).dtype == np.asarray(getattr(batch, name)).dtype, name
    assert np.array_equal(again.extras["reference_logprobs"], batch.extras["reference_logprobs"])
    assert again.episodes is None  # unpacked: each row one episode


def test_a_packed_batch_crosses_with_its_episodes():
    sequences = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    batch = pack_batch(sequences, loss_masks=[[0, 1, 1], [0, 1], [0, 1, 1, 1]], behaviour_logprobs=None,
                       advantages=[0.5, -0.5, 1.0], length_buckets=(8,), pad_id=0, row_multiple=2)
    again = arrays_batch(decode(encode(Order(OrderKind.TRAIN, {}, batch_arrays(batch)))).arrays)
    assert np.array_equal(np.asarray(again.episodes), np.asarray(batch.episodes))
    assert np.array_equal(np.asarray(again.advantages), np.asarray(batch.advantages))
    assert int(np.max(np.asarray(again.episodes))) == 2


def _leader_of_a_run(directory: Path) -> dict:
    """Process 0 of the "run" test: RunTrainer's calls, in its order, without the platform or Redis."""
    import jax
    import jax.numpy as jnp

    from tandem.configs.run import RunConfig
    from trainer.checkpoints import RunProgress
    from trainer.dataset_evaluation import held_out_token_statistics
    from trainer.learner import Learner
    from trainer.lockstep import AnnouncedReference, Leader
    from trainer.sharding import host_copy, shard_batch
    from trainer.train_state import set_learning_rate
    from trainer.train_step import mean_metrics, train_updates

    lockstep = Leader()
    # Micro-batches of two rows and small logits chunks: the follower builds its steps from the same
    # memory section, and accumulates the gradients of its half of each micro-batch with the leader's.
    config = RunConfig.model_validate({"mesh": {"data": 2, "fsdp": 2}, "algorithm": {"kl": {}},
                                       "model": {"max_seq_len": 64},
                                       "memory": {"micro_batch_tokens": 64, "logits_chunk_tokens": 32}})
    # Built as RunTrainer builds it, so the follower's (FollowedRun's) is the same.
    learner = Learner(config, vocab_size=64)
    graphdef, shardings = learner.graphdef, learner.shardings
    lockstep.announce(OrderKind.START, {"run_id": 1, "config": config.model_dump(mode="json"), "vocab_size": 64,
                                        "checkpoint_directory": str(directory / "run-1"),
                                        "weights_directory": str(directory / "weights")})
    learner.open_checkpoints(directory / "run-1", max_to_keep=3)

    def train(phase, batch, step, learning_rate):
        lockstep.announce_batch(OrderKind.TRAIN, batch, {"phase": phase, "step": step,
                                                         "learning_rate": learning_rate, "updates": 1})
        set_learning_rate(learner.state, learning_rate)
        learner.state, per_update = train_updates(learner.steps[phase], learner.state,
                                                  shard_batch(batch, shardings), updates=1)
        lockstep.trained(step=step, phase=phase, metrics=mean_metrics(per_update))

    train("sft", _batch(4, 32), 1, 1e-3)
    lockstep.announce(OrderKind.REFERENCE)
    reference = AnnouncedReference(graphdef, jax.tree.map(jnp.copy, learner.state.params), lockstep=lockstep)
    base = _batch(4, 32).replace(extras={})
    rl_batch = base.replace(extras={"reference_logprobs": reference.logprobs(
        base, temperature=1.0, logits_chunk_tokens=config.memory.logits_chunk_tokens)})
    lockstep.announce_batch(OrderKind.SCORE, base)
    scored = host_copy(held_out_token_statistics(graphdef, learner.state.params, shard_batch(base, shardings)))
    lockstep.announce(OrderKind.CHECKPOINT, {"step": 1, "progress": RunProgress(step=1).model_dump(mode="json"),
                                             "with_reference": True})
    learner.save_checkpoint(1, progress=RunProgress(step=1), reference_params=reference.params)
    lockstep.announce(OrderKind.WAIT_FOR_CHECKPOINTS)
    learner.checkpointer.wait_until_finished()
    train("sft", _batch(4, 32), 2, 5e-4)  # moved on from the checkpoint, then back to it
    lockstep.announce(OrderKind.RESTORE, {"step": 1})
    progress = learner.restore_checkpoint(1)
    lockstep.announce(OrderKind.RESTORE_REFERENCE, {"step": 1})
    reference = AnnouncedReference(graphdef, learner.restore_reference(1), lockstep=lockstep)
    train("rl", rl_batch, 2, 2e-4)
    lockstep.announce(OrderKind.END)
    learner.close()
    lockstep.quit()
    return {"restored_step": progress.step, "scored_rows": len(scored[0])}


def _follower_dies(process_id: int) -> dict:
    import threading
    import time

    import jax

    from trainer.job_liveness import FollowerWatch, ProcessBeat, read_beats
    from trainer.lockstep import Leader, receive

    if process_id == 0:
        def on_silent(silent_process: int, silent_s: float) -> None:
            print("silent: " + json.dumps({"process": silent_process, "beats_seen": int(read_beats()[1])}),
                  flush=True)
            os._exit(LOST_PROCESS_EXIT_CODE)

        FollowerWatch([1], lapse_s=LAPSE_S, on_silent=on_silent).start()
        Leader().announce(OrderKind.IDLE)
        # Stands in for a collective that waits for good on a dead process; the watch ends this process.
        threading.Event().wait(120)
        return {"unexpected": "the watch never noticed the dead follower"}
    ProcessBeat(jax.process_index(), beat_s=BEAT_S).start()
    receive()
    # Beats for three lapses, so that a watch that misread a live follower would show it.
    deadline = time.monotonic() + 3 * LAPSE_S
    while time.monotonic() < deadline:
        time.sleep(BEAT_S)
    beats = int(read_beats()[1])
    print(f"dies after beats {beats}", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    return {}


def _child(role: str, process_id: int, port: int, *args: str) -> dict:
    import logging

    from trainer.lockstep import Leader, receive
    from trainer.sharding import initialize_distributed

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, force=True)
    assert initialize_distributed(f"127.0.0.1:{port}", 2, process_id, heartbeat_timeout_s=10)
    if role == "run":
        if process_id == 0:
            return _leader_of_a_run(Path(args[0]))
        from trainer.follower import follow

        return {"followed": follow(redis_url="redis://127.0.0.1:1/0")}
    if role == "orders":
        if process_id == 0:
            leader = Leader()
            for order in _orders():
                leader.announce(order.kind, order.fields, order.arrays)
            return {"sent": len(_orders())}
        received = []
        while not received or received[-1]["kind"] != OrderKind.QUIT:
            received.append(_digest(receive()))
        return {"received": received}
    if role == "follower_dies":
        return _follower_dies(process_id)
    # leader_dies
    if process_id == 0:
        Leader().announce(OrderKind.IDLE)
        os.kill(os.getpid(), signal.SIGKILL)
    print(f"received {receive().kind}", flush=True)
    receive()  # never answered: the leader is dead
    return {"unexpected": "the follower received an order from a dead leader"}


if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:])), flush=True)
