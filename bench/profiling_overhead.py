"""What the trainer's profiling costs: the step loop with profiling on against off, in the same run.

"Off" is the step as the run loop did it before profiling: transfer the batch,
run the jitted update, fetch its metrics, build the step event. "On" adds what
profiling does every step: a stage timeline (five stages, with
``block_until_ready`` at the transfer and at the new state), the device
monitor's bookkeeping, a :class:`DeviceReport` when its interval is due, and
the larger event serialised as JSON. On and off steps alternate, so drift in
a shared machine's speed falls on both alike.

The ratio of step times is what a user pays, but on a shared CPU one step's
noise is far beyond the 1% level. So each on step is paired with the off step
beside it, and the wall-time overhead is the geometric mean of the paired
ratios with a 95% confidence interval (``wall_overhead_ci95``, from the
spread of the log ratios): with enough pairs the interval is narrower than
1%, and ``wall_overhead_below_1_percent`` says whether its upper end is.
``bookkeeping_us_per_step`` times the host-side profiling work alone (no
device work), the cost that does not hide behind the device, and
``overhead_fraction`` is it over the median step.

Usage: ``python bench/profiling_overhead.py [--steps N] [--batch-size B] [--model nano|small]``
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from train_step import MODEL_SIZES, random_rl_batch  # noqa: E402

from policy import ByteTokenizer, Transformer, TransformerConfig  # noqa: E402
from tandem.configs.run import RunConfig  # noqa: E402
from tandem.contracts import TrainerStepEvent  # noqa: E402
from trainer.devices import DeviceMonitor, parameter_count  # noqa: E402
from trainer.losses import grpo_loss  # noqa: E402
from trainer.profiling import StageRecorder, timeline_wall_s  # noqa: E402
from trainer.run_loop import TrainerSettings  # noqa: E402
from trainer.sharding import make_mesh, shard_batch, shard_train_state, step_shardings  # noqa: E402
from trainer.train_batch import batch_tokens  # noqa: E402
from trainer.train_state import create_train_state, make_optimizer  # noqa: E402
from trainer.train_step import make_train_step, on_token_statistics  # noqa: E402


def _event(step: int, loss: float, **fields) -> str:
    return TrainerStepEvent(run_id=1, step=step, phase="rl", policy_version=step, loss=loss,
                            emitted_at=time.time(), **fields).model_dump_json()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400, help="timed steps of each kind, after the compile")
    parser.add_argument("--batch-size", type=int, default=RunConfig().rollout.episodes_per_step,
                        help="rows per update; default: a default run's episodes per RL step")
    parser.add_argument("--model", default="nano", choices=sorted(MODEL_SIZES))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    tokenizer = ByteTokenizer()
    shape = MODEL_SIZES[args.model]
    config = TransformerConfig.from_model_config(shape.config, shape.vocab_size)
    model = Transformer(config, rngs=nnx.Rngs(args.seed))
    optimizer = make_optimizer(1e-4)
    graphdef, state = create_train_state(model, optimizer)
    shardings = step_shardings(make_mesh(RunConfig().mesh), state)
    state = shard_train_state(state, shardings)
    train_step = make_train_step(graphdef, optimizer, on_token_statistics(functools.partial(grpo_loss, clip_epsilon=0.2)),
                                 shardings=shardings)
    rng = np.random.default_rng(args.seed)
    batches = [random_rl_batch(rng, batch_size=args.batch_size, seq_len=config.max_seq_len,
                               pad_id=tokenizer.pad_id, vocab_size=shape.sampled_ids) for _ in range(2)]
    recorder = StageRecorder()
    monitor = DeviceMonitor(parameters=parameter_count(state.params),
                            interval_s=TrainerSettings(redis_url="", checkpoint_root=Path("."),
                                                       consumer_name="").device_report_interval_s)

    def step_off(index: int) -> None:
        nonlocal state
        started = time.perf_counter()
        batch = batches[index % 2]
        state, metrics = train_step(state, shard_batch(batch, shardings))
        metrics = {name: float(value) for name, value in jax.device_get(metrics).items()}
        wall_s = time.perf_counter() - started
        _event(index, metrics["loss"], wall_s=wall_s, wait_s=0.0, compute_s=wall_s, publish_s=0.0, other_s=0.0)

    def step_on(index: int) -> None:
        nonlocal state
        stage = recorder.stage
        with stage("batch"):
            batch = batches[index % 2]
        with stage("host_to_device"):
            sharded = jax.block_until_ready(shard_batch(batch, shardings))
        with stage("compute"):
            state, metrics = train_step(state, sharded)
            jax.block_until_ready(state)
            metrics = {name: float(value) for name, value in jax.device_get(metrics).items()}
        with stage("publish"):
            pass
        with stage("checkpoint"):
            pass
        timeline = recorder.finish()
        with stage("telemetry"):
            seconds = timeline.seconds_by_stage()
            wall_s = timeline_wall_s(timeline)
            monitor.observe(timeline, tokens=batch_tokens(batch))
            device = monitor.sample() if monitor.due() else None
            _event(index, metrics["loss"], wall_s=wall_s, wait_s=0.0, compute_s=seconds["compute"],
                   publish_s=seconds["publish"], other_s=0.0, timeline=timeline, device=device)

    for index in range(2):  # compile, and warm both paths
        step_off(index)
        step_on(index)
    times = {"off": [], "on": []}
    for index in range(args.steps):
        # Alternate every step, and which goes first every other step.
        order = (("off", step_off), ("on", step_on)) if index % 2 else (("on", step_on), ("off", step_off))
        for kind, step in order:
            started = time.perf_counter()
            step(index)
            times[kind].append(time.perf_counter() - started)
    if train_step.trace_count != 1:
        raise RuntimeError(f"the step recompiled: traced {train_step.trace_count} times")

    # The host-side profiling work alone, over many repetitions: stages, timeline, monitor, event.
    repetitions = 2000
    bookkeeping_started = time.perf_counter()
    for index in range(repetitions):
        for name in ("batch", "host_to_device", "compute", "publish", "checkpoint"):
            with recorder.stage(name):
                pass
        timeline = recorder.finish()
        with recorder.stage("telemetry"):
            monitor.observe(timeline, tokens=batch_tokens(batches[0]))
            _event(index, 0.0, wall_s=1.0, wait_s=0.0, compute_s=1.0, publish_s=0.0, other_s=0.0,
                   timeline=timeline)
    bookkeeping_s = (time.perf_counter() - bookkeeping_started) / repetitions
    baseline_started = time.perf_counter()
    for index in range(repetitions):
        _event(index, 0.0, wall_s=1.0, wait_s=0.0, compute_s=1.0, publish_s=0.0, other_s=0.0)
    bookkeeping_s -= (time.perf_counter() - baseline_started) / repetitions
    sample_started = time.perf_counter()
    for _ in range(20):
        monitor.sample()
    device_sample_s = (time.perf_counter() - sample_started) / 20

    off_s, on_s = statistics.median(times["off"]), statistics.median(times["on"])
    log_ratios = [math.log(on / off) for on, off in zip(times["on"], times["off"], strict=True)]
    log_mean = statistics.fmean(log_ratios)
    log_half_width = 1.96 * statistics.stdev(log_ratios) / math.sqrt(len(log_ratios))
    wall_overhead = math.exp(log_mean) - 1
    wall_overhead_ci95 = (math.exp(log_mean - log_half_width) - 1, math.exp(log_mean + log_half_width) - 1)
    # The device sample happens once per interval: its cost spread over the steps of an interval.
    amortised_s = bookkeeping_s + device_sample_s * off_s / monitor.interval_s
    print(json.dumps({
        "model": args.model,
        "batch_size": args.batch_size,
        "steps": args.steps,
        "backend": jax.default_backend(),
        "device": jax.devices()[0].device_kind,
        "step_s_off": round(off_s, 6),
        "step_s_on": round(on_s, 6),
        "on_vs_off_step_ratio": round(on_s / off_s, 4),
        "on_vs_off_fastest_step_ratio": round(min(times["on"]) / min(times["off"]), 4),
        # Each on step against the off step run right beside it: the least disturbed by a busy machine.
        "on_vs_off_paired_ratio_median": round(statistics.median(
            on / off for on, off in zip(times["on"], times["off"], strict=True)), 4),
        # Geometric mean of the paired ratios, minus one, and its 95% confidence interval.
        "wall_overhead": round(wall_overhead, 5),
        "wall_overhead_ci95": [round(bound, 5) for bound in wall_overhead_ci95],
        "wall_overhead_below_1_percent": wall_overhead_ci95[1] < 0.01,
        "bookkeeping_us_per_step": round(bookkeeping_s * 1e6, 2),
        "device_sample_ms": round(device_sample_s * 1e3, 3),
        "device_report_interval_s": monitor.interval_s,
        "overhead_fraction": round(amortised_s / off_s, 6),
        "within_1_percent": amortised_s / off_s < 0.01,
    }))


if __name__ == "__main__":
    main()
