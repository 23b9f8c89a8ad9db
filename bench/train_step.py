"""Trainer throughput: step time and tokens/s of the jitted GRPO update, per model size.

Builds the trainer's real update, ``make_train_step(graphdef, optimizer,
on_token_statistics(grpo_loss))`` with the run loop's optimizer, and feeds it padded
random batches shaped like RL data (right-padded conversations whose second
half is policy tokens). Each size is compiled by a first step, then ``--steps``
steps are timed one by one, each ended by ``block_until_ready``. Runs on
whatever backend JAX picks (CPU, GPU, TPU). Prints one JSON line.

Usage: ``python bench/train_step.py [--steps N] [--batch-size B] [--sizes nano,small]
[--seq-len T] [--param-dtype float32|bfloat16]``

``smollm2-135m`` is SmolLM2-135M-Instruct's architecture (30 layers, d_model 576,
grouped-query attention, its 49,152-token vocabulary, tied embeddings) with random
weights: step time, memory and MFU do not depend on the weights' values, and the
shape runs where the imported model cannot travel (an accelerator lent without it).

``tokens_per_s`` counts every slot of the padded [batch, seq] input, i.e. what
the device computes, not only the real tokens. ``memory`` is the device's own
``memory_stats()`` after the timed steps, or null where the backend does not
report it (CPU); one size per process gives each its own peak. ``mfu`` is the
model's FLOPs per token (PaLM's count: 6 per matmul parameter, the LM head
included, plus 12 x layers x attention width x sequence length for attention)
times tokens/s, over a square matmul's measured FLOP/s in the same dtype
(``matmul_flops_per_s``), not a spec sheet's figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from policy import ByteTokenizer, Transformer, TransformerConfig, count_parameters  # noqa: E402
from tandem.configs.model import PARAM_DTYPES, ModelConfig  # noqa: E402
from trainer.losses import grpo_loss  # noqa: E402
from trainer.train_batch import TrainBatch, pad_batch  # noqa: E402
from trainer.train_state import create_train_state, make_optimizer  # noqa: E402
from trainer.train_step import make_train_step, on_token_statistics  # noqa: E402

BYTE_VOCAB = ByteTokenizer().vocab_size


@dataclass(frozen=True)
class ModelShape:
    """A model to time: its architecture and the vocabulary its tokenizer would give it."""

    config: ModelConfig
    vocab_size: int = BYTE_VOCAB
    # TransformerConfig fields a run config cannot set, which the model's checkpoint sets (Gemma 3's).
    features: dict = field(default_factory=dict)

    def transformer(self, model_config: ModelConfig | None = None) -> TransformerConfig:
        """The policy's architecture, at ``model_config``'s sizes (default: the shape's own)."""
        base = TransformerConfig.from_model_config(model_config or self.config, self.vocab_size)
        return dataclasses.replace(base, **self.features)

    @property
    def sampled_ids(self) -> int:
        """Random batches draw ids below this: a byte model's bytes (not PAD, BOS, EOS), else any id."""
        return 256 if self.vocab_size == BYTE_VOCAB else self.vocab_size


# The nano model is the run config's default. "small" has 26x its parameters and
# keeps a step within about 1-2 s on a shared 2-core CPU (max_seq_len 256 did not).
MODEL_SIZES = {
    "nano": ModelShape(ModelConfig()),
    "small": ModelShape(ModelConfig(d_model=256, num_layers=4, num_heads=8, mlp_dim=1024, max_seq_len=128)),
    # SmolLM2-135M-Instruct's config.json, as `tandem models import` reads it.
    "smollm2-135m": ModelShape(ModelConfig(d_model=576, num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64,
                                           mlp_dim=1536, rope_theta=100_000.0, rms_norm_eps=1e-5,
                                           tie_embeddings=True, max_seq_len=1024), vocab_size=49_152),
    # Gemma 3 270M's config.json, as `tandem models import` reads it.
    "gemma3-270m": ModelShape(
        ModelConfig(d_model=640, num_layers=18, num_heads=4, num_kv_heads=1, head_dim=256, mlp_dim=2048,
                    rope_theta=1_000_000.0, qk_norm=True, tie_embeddings=True, max_seq_len=1024),
        vocab_size=262_144,
        features=dict(layer_attention=(("sliding",) * 5 + ("full",)) * 3, sliding_window=512,
                      sliding_rope_theta=10_000.0, query_pre_attention_scalar=256, post_sublayer_norms=True,
                      scale_embeddings=True, mlp_activation="gelu_tanh")),
}


def random_rl_batch(
    rng: np.random.Generator, *, batch_size: int, seq_len: int, pad_id: int, vocab_size: int = 256
) -> TrainBatch:
    """Right-padded token sequences of seq_len/2 .. seq_len tokens; the second half is the policy's."""
    sequences, loss_masks, logprobs = [], [], []
    for _ in range(batch_size):
        length = int(rng.integers(seq_len // 2, seq_len + 1))
        prompt_len = length // 2
        sequences.append(rng.integers(0, vocab_size, size=length).tolist())
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


def matmul_flops_per_s(dtype: str, *, size: int, repeats: int = 10) -> float:
    """FLOP/s of a ``size``-square matmul in ``dtype`` on the default device: the MFU's denominator."""
    keys = jax.random.split(jax.random.key(0))
    left, right = (jax.random.normal(key, (size, size), dtype=dtype) for key in keys)
    product = jax.jit(jnp.matmul)
    product(left, right).block_until_ready()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        product(left, right).block_until_ready()
        times.append(time.perf_counter() - started)
    return 2 * size**3 / statistics.median(times)


def model_flops_per_token(model: Transformer, config: TransformerConfig, seq_len: int) -> int:
    """Training FLOPs per token, PaLM's count: 6 per matmul parameter (norms aside; an untied embedding
    table is a lookup, the LM head a matmul), plus 12 x layers x attention width x sequence length."""
    norms = sum(leaf.size for path, leaf in nnx.to_flat_state(nnx.state(model, nnx.Param))
                if any("norm" in str(part) for part in path))
    lookup_only = 0 if config.tie_embeddings else config.vocab_size * config.d_model
    matmul_params = count_parameters(model) - norms - lookup_only
    head_dim = config.head_dim or config.d_model // config.num_heads
    return 6 * matmul_params + 12 * config.num_layers * config.num_heads * head_dim * seq_len


def bench_size(shape: ModelShape, *, batch_size: int, steps: int, seed: int, seq_len: int | None = None,
               param_dtype: str | None = None, peak_flops_per_s: float | None = None) -> dict:
    overrides = {key: value for key, value in (("max_seq_len", seq_len), ("param_dtype", param_dtype)) if value}
    model_config = shape.config.model_copy(update=overrides)
    tokenizer = ByteTokenizer()
    config = shape.transformer(model_config)
    model = Transformer(config, rngs=nnx.Rngs(seed))
    params = count_parameters(model)
    flops_per_token = model_flops_per_token(model, config, config.max_seq_len)
    optimizer = make_optimizer(1e-4)
    graphdef, state = create_train_state(model, optimizer)
    del model
    train_step = make_train_step(
        graphdef, optimizer, on_token_statistics(functools.partial(grpo_loss, clip_epsilon=0.2))
    )
    rng = np.random.default_rng(seed)
    # Two batches alternate, so no step can reuse a result cached for its input.
    batches = [
        random_rl_batch(rng, batch_size=batch_size, seq_len=config.max_seq_len,
                        pad_id=tokenizer.pad_id, vocab_size=shape.sampled_ids)
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
    tokens_per_s = tokens_per_step / step_s
    return {
        "step_s": round(step_s, 5),
        "step_s_min": round(min(step_times), 5),
        "step_s_mean": round(statistics.fmean(step_times), 5),
        "tokens_per_s": round(tokens_per_s, 1),
        "model_flops_per_token": flops_per_token,
        "mfu": round(flops_per_token * tokens_per_s / peak_flops_per_s, 4) if peak_flops_per_s else None,
        "param_dtype": config.param_dtype,
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
    parser.add_argument("--seq-len", type=int, help="default: each size's max_seq_len")
    parser.add_argument("--param-dtype", choices=PARAM_DTYPES, help="default: each size's (float32)")
    parser.add_argument("--matmul-size", type=int, default=0,
                        help="the MFU's measured matmul (0: 8192 on an accelerator, 2048 on CPU)")
    args = parser.parse_args()

    matmul_size = args.matmul_size or (2048 if jax.default_backend() == "cpu" else 8192)
    dtype = args.param_dtype or "float32"
    peak = matmul_flops_per_s(dtype, size=matmul_size)
    results = {}
    for name in args.sizes.split(","):
        results[name] = bench_size(MODEL_SIZES[name], batch_size=args.batch_size, steps=args.steps, seed=args.seed,
                                   seq_len=args.seq_len, param_dtype=args.param_dtype, peak_flops_per_s=peak)
    device = jax.devices()[0]
    output = {
        **results,
        "matmul_flops_per_s": {"dtype": dtype, "size": matmul_size, "flops_per_s": round(peak)},
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
