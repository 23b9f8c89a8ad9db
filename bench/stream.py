"""Throughput and latency of the trajectory transport: XADD -> XREADGROUP -> parse -> XACK.

Records are realistic: ~200 tokens (ids, behaviour log-probs, loss mask), a
few policy turns, groups of ``--group-size``. The consumer side is the
trainer's own code (:class:`trainer.stream.TrajectoryStreamReader`, its
consumed-ledger dedupe and :class:`trainer.stream.GroupAssembler`).

- ``trajectories_per_s``: a producer process appends ``--trajectories`` records
  (one XADD each, as Celery producers do) while the trainer side reads,
  assembles and acknowledges them; count over the wall time until the last ack.
- ``produce_per_s`` / ``consume_per_s``: each side alone (serialise + XADD; read +
  parse + dedupe + assemble + ack_consumed of a pre-filled stream).
- ``latency_ms_p50`` / ``_p99``: serialisation to acknowledgement, with
  trajectories arriving at the trainer's pace (``--episodes-per-step`` every
  ``--step-s``) rather than all at once. It includes waiting for the rest of
  the group (episodes of a group are spread over the pace here), not a train
  step. ``read_latency_ms_*``: serialisation to parsed in the trainer.
- ``transport_share_of_step``: the trainer thread's transport time for one
  step's episodes, over ``--step-s``.

Uses its own run id in ``--redis-url`` (db 13 by default) and deletes its keys
afterwards. Prints one JSON line. Usage: ``python bench/stream.py [--step-s 0.05]``
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tandem.contracts import EpisodeTimings, TrajectoryRecord, run_keys, trajectory_stream  # noqa: E402
from trainer.stream import GroupAssembler, TrajectoryStreamReader  # noqa: E402


def _record(run_id: int, group_id: str, group_size: int, rng: random.Random, tokens: int) -> TrajectoryRecord:
    """An episode of three policy turns over a prompt and two observations."""
    mask = [0] * 40 + [1] * 40 + [0] * 20 + [1] * 40 + [0] * 20 + [1] * (tokens - 160)
    now = time.time()
    return TrajectoryRecord(
        run_id=run_id, group_id=group_id, group_size=group_size, environment="calculator",
        policy_version=12, policy_versions=[12, 12, 13],
        token_ids=[rng.randrange(32_000) for _ in range(tokens)],
        behaviour_logprobs=[-rng.random() * 3 if m else 0.0 for m in mask],
        loss_mask=mask, reward=rng.random(), num_turns=3,
        timings=EpisodeTimings(started_at=now - 2.0, finished_at=now, generation_s=1.5, environment_s=0.3),
    )


def _produce(redis_url: str, run_id: int, count: int, group_size: int, tokens: int, rate_per_s: float | None,
             seed: int) -> None:
    """Append ``count`` records; ``finished_at`` is stamped just before serialisation."""
    client = redis.Redis.from_url(redis_url)
    rng = random.Random(seed)
    stream = trajectory_stream(run_id)
    started = time.perf_counter()
    template = [_record(run_id, "template", group_size, rng, tokens) for _ in range(8)]
    for index in range(count):
        if rate_per_s:
            delay = started + index / rate_per_s - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        base = template[index % len(template)]
        record = base.model_copy(update={
            "trajectory_id": uuid.uuid4().hex,
            "group_id": f"{seed}-{index // group_size}",
            "timings": base.timings.model_copy(update={"finished_at": time.time()}),
        })
        client.xadd(stream, record.to_stream_fields())
    client.close()


def _consume(reader: TrajectoryStreamReader, count: int, *, latencies: list[float] | None = None,
             read_latencies: list[float] | None = None, timeout_s: float = 120.0) -> None:
    """Read, assemble and acknowledge ``count`` records, as the trainer's loop does."""
    assembler = GroupAssembler()
    done = 0
    deadline = time.monotonic() + timeout_s
    while done < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"consumed {done} of {count} trajectories")
        entries = reader.read(block_ms=50)
        if read_latencies is not None:
            read_at = time.time()
            read_latencies.extend(read_at - e.record.timings.finished_at for e in entries)
        for entry in entries:
            assembler.add(entry)
        groups = assembler.take(assembler.complete_groups())
        reader.ack_consumed(groups)
        reader.ack(assembler.take_duplicates())
        acked_at = time.time()
        for group in groups:
            done += len(group)
            if latencies is not None:
                latencies.extend(acked_at - e.record.timings.finished_at for e in group)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/13")
    parser.add_argument("--trajectories", type=int, default=4096)
    parser.add_argument("--tokens", type=int, default=200, help="Tokens per trajectory.")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--episodes-per-step", type=int, default=32)
    parser.add_argument("--step-s", type=float, default=0.05, help="Trainer step time to compare against.")
    parser.add_argument("--latency-steps", type=int, default=60, help="Steps' worth of paced trajectories.")
    args = parser.parse_args()
    client = redis.Redis.from_url(args.redis_url)
    rng = random.Random(0)
    run_ids = [rng.randrange(10**9, 2 * 10**9) for _ in range(3)]
    sample = _record(run_ids[0], "g", args.group_size, random.Random(1), args.tokens)
    try:
        # 1. Producer and trainer together, as fast as they go.
        reader = TrajectoryStreamReader(client, run_id=run_ids[0], consumer="bench")
        producer = multiprocessing.get_context("fork").Process(
            target=_produce,
            args=(args.redis_url, run_ids[0], args.trajectories, args.group_size, args.tokens, None, 1),
        )
        started = time.perf_counter()
        producer.start()
        _consume(reader, args.trajectories)
        together_s = time.perf_counter() - started
        producer.join()

        # 2. Each side alone.
        started = time.perf_counter()
        _produce(args.redis_url, run_ids[1], args.trajectories, args.group_size, args.tokens, None, 2)
        produce_s = time.perf_counter() - started
        reader = TrajectoryStreamReader(client, run_id=run_ids[1], consumer="bench")
        started = time.perf_counter()
        _consume(reader, args.trajectories)
        consume_s = time.perf_counter() - started
        per_trajectory_s = consume_s / args.trajectories

        # 3. Latency at the trainer's pace.
        paced = args.latency_steps * args.episodes_per_step
        reader = TrajectoryStreamReader(client, run_id=run_ids[2], consumer="bench")
        producer = multiprocessing.get_context("fork").Process(
            target=_produce,
            args=(args.redis_url, run_ids[2], paced, args.group_size, args.tokens,
                  args.episodes_per_step / args.step_s, 3),
        )
        latencies: list[float] = []
        read_latencies: list[float] = []
        producer.start()
        _consume(reader, paced, latencies=latencies, read_latencies=read_latencies)
        producer.join()
        latencies_ms = np.array(latencies) * 1000
        read_latencies_ms = np.array(read_latencies) * 1000
        transport_per_step_s = per_trajectory_s * args.episodes_per_step
        print(json.dumps({
            "trajectories_per_s": round(args.trajectories / together_s, 1),
            "produce_per_s": round(args.trajectories / produce_s, 1),
            "consume_per_s": round(args.trajectories / consume_s, 1),
            "latency_ms_p50": round(float(np.percentile(latencies_ms, 50)), 3),
            "latency_ms_p99": round(float(np.percentile(latencies_ms, 99)), 3),
            "read_latency_ms_p50": round(float(np.percentile(read_latencies_ms, 50)), 3),
            "read_latency_ms_p99": round(float(np.percentile(read_latencies_ms, 99)), 3),
            "transport_s_per_step": round(transport_per_step_s, 6),
            "transport_share_of_step": round(transport_per_step_s / args.step_s, 4),
            "record_bytes": len(sample.to_stream_fields()["payload"]),
            "tokens": args.tokens,
            "trajectories": args.trajectories,
            "episodes_per_step": args.episodes_per_step,
            "step_s": args.step_s,
            "paced_trajectories": paced,
        }))
    finally:
        for run_id in run_ids:
            client.delete(*run_keys(run_id))
        client.close()


if __name__ == "__main__":
    main()
