"""Trainer throughput: step time and tokens/s of the jitted GRPO update, per model size.

Builds the trainer's real update, ``make_train_step(graphdef, optimizer,
on_logits(grpo_loss))`` with the run loop's optimizer, and feeds it padded
random batches shaped like RL data (right-padded conversations whose second
half is policy tokens). Each size is compiled by a first step, then ``--steps``
steps are timed one by one, each ended by ``block_until_ready``. Runs on
whatever backend JAX picks (CPU, GPU, TPU). Prints one JSON line.

Usage: ``python bench/train_step.py [--steps N] [--batch-size B]``

``tokens_per_s`` counts every slot of the padded [batch, seq] input, i.e. what
the device computes, not only the real tokens. ``memory`` is the device's own
``memory_stats()`` after the timed steps, or null where the backend does not
report it (CPU).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from policy import ByteTokenizer, Transformer, TransformerConfig, count_parameters  # noqa: E402
from tandem.configs.model import ModelConfig  # noqa: E402
from trainer.losses import grpo_loss  # noqa: E402
from trainer.train_state import make_optimizer  # noqa: E402
from trainer.train_step import (  # noqa: E402
    TrainBatch,
    create_train_state,
    make_train_step,
    on_logits,
    pad_batch,
)

# The nano model is the run config's default. "small" has 26x its parameters and
# keeps a step within about 1-2 s on a shared 2-core CPU (max_seq_len 256 did not).
MODEL_SIZES = {
    "nano": ModelConfig(),
    "small": ModelConfig(d_model=256, num_layers=4, num_heads=8, mlp_dim=1024, max_seq_len=128),
}


def random_rl_batch(
    rng: np.random.Generator, *, batch_size: int, seq_len: int, pad_id: int
) -> TrainBatch:
    """Right-padded byte sequences of seq_len/2 .. seq_len tokens; the second half is the policy's."""
    sequences, loss_masks, logprobs = [], [], []
    for _ in range(batch_size):
        length = int(rng.integers(seq_len // 2, seq_len + 1))
        prompt_len = length // 2
        sequences.append(rng.integers(0, 256, size=length).tolist())
        loss_masks.append([0] * prompt_len + [1] * (length - prompt_len))
        logprobs.append(
            [0.0] * prompt_len + (-rng.exponential(2.0, size=length - prompt_len)).tolist()
        )
    return pad_batch(
        sequences,
        loss_masks=loss_masks,
        behaviour_logprobs=logprobs,
        advantages=rng.standard_normal(batch_size).tolist(),
        batch_size=batch_size,
        length_buckets=(seq_len,),
        pad_id=pad_id,
    )


def memory_stats() -> dict[str, int] | None:
    """The device's allocator statistics, or None where the backend keeps none (CPU)."""
    stats = jax.devices()[0].memory_stats()
    if not stats:
        return None
    keys = ("bytes_in_use", "peak_bytes_in_use", "bytes_limit")
    return {key: int(stats[key]) for key in keys if key in stats}


def bench_size(model_config: ModelConfig, *, batch_size: int, steps: int, seed: int) -> dict:
    tokenizer = ByteTokenizer()
    config = TransformerConfig.from_model_config(model_config, tokenizer.vocab_size)
    model = Transformer(config, rngs=nnx.Rngs(seed))
    params = count_parameters(model)
    optimizer = make_optimizer(1e-4)
    graphdef, state = create_train_state(model, optimizer)
    del model
    train_step = make_train_step(
        graphdef, optimizer, on_logits(functools.partial(grpo_loss, clip_epsilon=0.2))
    )
    rng = np.random.default_rng(seed)
    # Two batches alternate, so no step can reuse a result cached for its input.
    batches = [
        random_rl_batch(rng, batch_size=batch_size, seq_len=config.max_seq_len,
                        pad_id=tokenizer.pad_id)
        for _ in range(2)
    ]

    started = time.perf_counter()
    state, metrics = train_step(state, batches[0])
    jax.block_until_ready((state, metrics))
    compile_s = time.perf_counter() - started

    step_times = []
    for index in range(steps):
        started = time.perf_counter()
        state, metrics = train_step(state, batches[index % 2])
        jax.block_until_ready((state, metrics))
        step_times.append(time.perf_counter() - started)
    if train_step.trace_count != 1:
        raise RuntimeError(f"the step recompiled: traced {train_step.trace_count} times")

    step_s = statistics.median(step_times)
    tokens_per_step = batch_size * config.max_seq_len
    return {
        "step_s": round(step_s, 5),
        "step_s_min": round(min(step_times), 5),
        "step_s_mean": round(statistics.fmean(step_times), 5),
        "tokens_per_s": round(tokens_per_step / step_s, 1),
        "params": params,
        "batch_size": batch_size,
        "seq_len": config.max_seq_len,
        "shape": {"d_model": config.d_model, "num_layers": config.num_layers,
                  "num_heads": config.num_heads, "mlp_dim": config.mlp_dim,
                  "vocab_size": config.vocab_size},
        "first_step_s_with_compile": round(compile_s, 3),
        "loss_finite": bool(np.isfinite(float(metrics["loss"]))),
        "memory": memory_stats(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per size, after the compile")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--sizes", default=",".join(MODEL_SIZES), help="comma-separated subset of "
                        + ", ".join(MODEL_SIZES))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    results = {}
    for name in args.sizes.split(","):
        results[name] = bench_size(MODEL_SIZES[name], batch_size=args.batch_size,
                                   steps=args.steps, seed=args.seed)
    device = jax.devices()[0]
    output = {
        **results,
        "device": device.device_kind,
        "backend": jax.default_backend(),
        "device_count": jax.device_count(),
        "jax_version": jax.__version__,
        "steps": args.steps,
    }
    if "nano" in results and "small" in results:
        output["small_vs_nano_step_ratio"] = round(results["small"]["step_s"] / results["nano"]["step_s"], 2)
    print(json.dumps(output))


if __name__ == "__main__":
    main()
