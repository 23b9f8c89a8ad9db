"""Throughput of the inference engine: generated tokens/s with 1, 8 and 64 concurrent episodes.

Runs the nano policy (``tandem.configs.model.ModelConfig`` defaults, random
weights), or another of ``bench/train_step.py``'s sizes (``--size smollm2-135m``:
SmolLM2-135M's architecture and vocabulary), in one :class:`policy.InferenceEngine` with 64
slots, served by its background thread to asyncio episodes, as producers do.
An episode has three turns of up to 24 tokens with an 8-token observation
between them. A second workload (six short turns after a long prompt)
compares prefix reuse with re-encoding the whole history every turn (a fresh
session per turn). Prints one JSON line. Usage: ``python bench/sampler.py [--size S]
[--param-dtype D] [--episodes-scale F]``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from train_step import MODEL_SIZES, memory_stats  # noqa: E402

from policy import (  # noqa: E402
    ByteTokenizer,
    InferenceEngine,
    SamplingParams,
    Transformer,
    split_model,
)
from tandem.configs.model import PARAM_DTYPES  # noqa: E402

BYTES = ByteTokenizer()


def _tokens(rng: np.random.Generator, length: int) -> list[int]:
    return rng.integers(0, 256, length).tolist()


async def _episodes(
    engine: InferenceEngine,
    *,
    concurrency: int,
    episodes: int,
    prompt_len: int,
    turns: int,
    max_new_tokens: int,
    observation_len: int,
    reuse: bool,
) -> dict:
    """Run ``episodes`` episodes, ``concurrency`` at a time; returns tokens, seconds, latencies."""
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []
    generated = 0

    async def episode(index: int) -> None:
        nonlocal generated
        rng = np.random.default_rng(index)
        conversation = [BYTES.bos_id, *_tokens(rng, prompt_len - 1)]
        async with gate:
            for turn in range(turns):
                session = f"{index}" if reuse else f"{index}/{turn}"
                began = time.perf_counter()
                completion = await engine.generate(
                    session,
                    conversation,
                    SamplingParams(max_new_tokens=max_new_tokens, seed=index * 100 + turn),
                )
                latencies.append(time.perf_counter() - began)
                generated += len(completion.token_ids)
                conversation = conversation + completion.token_ids + _tokens(rng, observation_len)
                if not reuse:
                    engine.end_session(session)
            engine.end_session(f"{index}")

    started = time.perf_counter()
    await asyncio.gather(*(episode(index) for index in range(episodes)))
    wall_s = time.perf_counter() - started
    return {"tokens": generated, "wall_s": wall_s, "latencies": latencies}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chunk-size", type=int, default=8)
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--size", default="nano", choices=sorted(MODEL_SIZES))
    parser.add_argument("--param-dtype", choices=PARAM_DTYPES, help="default: the size's (float32)")
    parser.add_argument("--prefill-buckets", type=lambda text: [int(n) for n in text.split(",")],
                        help="prefill length buckets, comma-separated (default: the engine's, 16 up to the "
                             "model's max_seq_len); max_seq_len is always one. Fewer buckets, fewer compilations")
    parser.add_argument("--episodes-scale", type=float, default=1.0,
                        help="run this fraction of each workload's episodes (a large model on a slow device)")
    args = parser.parse_args()

    shape = MODEL_SIZES[args.size]
    model_config = shape.config.model_copy(update={"param_dtype": args.param_dtype} if args.param_dtype else {})
    config = shape.transformer(model_config)  # Gemma 3's sliding layers and all

    def scaled(episodes: int) -> int:
        return max(1, round(episodes * args.episodes_scale))

    graphdef, params = split_model(Transformer(config, rngs=nnx.Rngs(0)))
    engine = InferenceEngine(
        graphdef,
        config=config,
        eos_id=BYTES.eos_id,
        pad_id=BYTES.pad_id,
        num_slots=args.slots,
        chunk_size=args.chunk_size,
        prefill_buckets=args.prefill_buckets,
    )
    engine.set_params(params, version=0)
    began = time.perf_counter()
    engine.warmup()
    warmup_s = time.perf_counter() - began
    warm_traces = engine.trace_count
    print(f"warm-up: {warm_traces} compilations in {warmup_s:.1f} s", file=sys.stderr, flush=True)

    throughput = {}
    turn_latency_p50_ms = {}
    for concurrency, episodes in ((1, 160), (8, 320), (64, 640)):
        result = asyncio.run(
            _episodes(
                engine,
                concurrency=concurrency,
                episodes=scaled(episodes),
                prompt_len=31,
                turns=3,
                max_new_tokens=24,
                observation_len=8,
                reuse=True,
            )
        )
        throughput[str(concurrency)] = round(result["tokens"] / result["wall_s"], 1)
        print(f"{concurrency} sessions: {throughput[str(concurrency)]} tokens/s", file=sys.stderr, flush=True)
        turn_latency_p50_ms[str(concurrency)] = round(
            1e3 * float(np.median(result["latencies"])), 2
        )

    # Long history, short turns: where re-encoding the history each turn hurts most.
    prefix = {}
    for mode in ("reuse", "re_encode"):
        before = engine.stats
        result = asyncio.run(
            _episodes(
                engine,
                concurrency=16,
                episodes=scaled(160),
                prompt_len=50,
                turns=6,
                max_new_tokens=8,
                observation_len=4,
                reuse=mode == "reuse",
            )
        )
        prefix[mode] = {
            "tokens_per_s": round(result["tokens"] / result["wall_s"], 1),
            "prefilled_tokens": engine.stats.prefill_tokens - before.prefill_tokens,
        }

    print(
        json.dumps(
            {
                "tokens_per_s": throughput,
                "batching_speedup_64_vs_1": round(throughput["64"] / throughput["1"], 2),
                "turn_latency_p50_ms": turn_latency_p50_ms,
                "prefix_reuse": {
                    **prefix,
                    "speedup": round(
                        prefix["reuse"]["tokens_per_s"] / prefix["re_encode"]["tokens_per_s"], 2
                    ),
                    "prefill_token_ratio": round(
                        prefix["re_encode"]["prefilled_tokens"]
                        / prefix["reuse"]["prefilled_tokens"],
                        2,
                    ),
                },
                "model": {
                    "size": args.size,
                    "d_model": config.d_model,
                    "num_layers": config.num_layers,
                    "vocab_size": config.vocab_size,
                    "max_seq_len": config.max_seq_len,
                    "param_dtype": config.param_dtype,
                },
                "device": jax.devices()[0].device_kind,
                "memory": memory_stats(),
                "episodes_scale": args.episodes_scale,
                "num_slots": args.slots,
                "chunk_size": args.chunk_size,
                "prefill_buckets": args.prefill_buckets,  # None: the engine's default
                "warmup_s": round(warmup_s, 1),
                "compilations": warm_traces,
                "recompilations_after_warmup": engine.trace_count - warm_traces,
            }
        )
    )
    engine.close()


if __name__ == "__main__":
    main()
