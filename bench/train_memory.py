"""Trainer memory as batches grow: the peak of a full GRPO update with the KL penalty, per model and batch.

For each model and episode count, a process of its own (so that each has its own high-water mark)
builds the model with random weights (memory and speed do not depend on their values), a batch of
that many episodes of varied lengths up to ``--tokens`` (the first fifth a prompt, the rest the
policy's), computes the reference's log-probs as the trainer does, compiles the update ahead of time
(``compile_s``) and runs it once, timed. It reports:

- ``peak_bytes``: the process's resident high-water mark (``ru_maxrss``) on CPU; on an accelerator,
  the device's ``peak_bytes_in_use`` plus its ``peak_bytes_reserved``, where the backend reports them.
  On a TPU a compiled program's temporaries (the gradients, activations and logits chunks of the step)
  sit in a reserved block that ``bytes_in_use`` leaves out: alone, it showed the state and the code;
- ``planned_peak_bytes``: the run's memory plan for the same config and this device's platform
  (tandem/configs/memory_plan.py), and ``planned_parts`` its terms; ``compiled_memory``: XLA's ``memory_analysis()`` of the compiled update
  (temporaries, arguments, outputs, aliased and code bytes), to tell which term of the plan is off;
- ``tokens_per_s``: the batch's real tokens over the timed update's wall time;
- ``padding_fraction``: the share of the slots the step computed that was padding (the batch's rows
  and the empty rows that fill its last micro-batch); ``rows``: the batch's rows (fewer than the
  episodes with ``--pack``, which packs them several to a row, of ``--pack-row-tokens`` where given);
  ``row_tokens``: their length.

``unchunked`` runs today's step before this change on the counts up to ``--unchunked-max``: the whole
batch at once, no remat, and log-probs from the full ``[B, T, V]`` logits. A count whose plan (the whole
batch's logits as one chunk) exceeds the machine's available memory is ``skipped`` with both figures,
not run into the kernel's OOM killer; a measurement's process offers itself to that killer first.

``producer_warmup_s`` times a producer's inference engine (``--producer-slots`` KV-cache rows, buckets
up to ``--tokens``) compiling every prefill and decode bucket before its first episode, per model:
``first``, a worker's first run of the model on an empty compilation cache; ``second``, the next run's
engine in the same process (the compiled kernels are shared); ``new_process``, a new worker process on
the same host's persistent compilation cache (policy/compilation_cache.py). ``producer_peak_bytes`` is
the first process's resident high-water mark with its engine.

Usage: ``python bench/train_memory.py [--models smollm2-135m] [--episodes 16,64,256] [--tokens 1024]
[--micro-batch-tokens 4096] [--remat full] [--logits-chunk-tokens 4096] [--unchunked-max 16] [--pack]
[--pack-row-tokens 1408 | --pack-padding-target 0.1] [--no-producers]``. Prints one JSON line, and each measurement as it ends on stderr. Gemma 3 270M is built from its shape (bench/train_step.py), sliding layers and all.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _arguments(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="smollm2-135m,gemma3-270m")
    parser.add_argument("--episodes", default="16,64,256")
    parser.add_argument("--tokens", type=int, default=1024, help="the longest episode; the length bucket")
    parser.add_argument("--micro-batch-tokens", type=int, default=4096)
    parser.add_argument("--remat", default="full", choices=["none", "full", "save_matmuls"])
    parser.add_argument("--logits-chunk-tokens", type=int, default=4096)
    parser.add_argument("--pack", action="store_true",
                        help="pack the episodes several to a row (memory.pack_episodes)")
    parser.add_argument("--pack-row-tokens", type=int, default=None,
                        help="with --pack, rows of this many tokens (memory.pack_row_tokens)")
    parser.add_argument("--pack-padding-target", type=float, default=None,
                        help="with --pack, rows as long as it takes to compute at most this share of padding "
                        "(memory.pack_padding_target)")
    parser.add_argument("--attention-query-chunk", type=int, default=None,
                        help="a row's queries its trained forward attends at once (memory.attention_query_chunk_tokens); "
                        "default: whole rows")
    parser.add_argument("--unchunked-max", type=int, default=16,
                        help="run today's unchunked step on counts up to this (0: none)")
    parser.add_argument("--no-producers", dest="producers", action="store_false",
                        help="leave out the producers' warm-up (producer_warmup_s, producer_peak_bytes)")
    parser.add_argument("--producer-slots", type=int, default=16, help="KV-cache rows of the timed engines")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def _run_config(model: str, episodes: int, arguments: argparse.Namespace, *, unchunked: bool) -> dict:
    from bench.train_step import MODEL_SIZES
    from tandem.configs.run import RunConfig

    shape = MODEL_SIZES[model]
    # Today's step holds the whole batch's logits: its plan counts them as one chunk.
    memory = ({"micro_batch_tokens": None, "remat": "none", "logits_chunk_tokens": episodes * arguments.tokens}
              if unchunked else
              {"micro_batch_tokens": arguments.micro_batch_tokens, "remat": arguments.remat,
               "logits_chunk_tokens": arguments.logits_chunk_tokens, "pack_episodes": arguments.pack,
               "pack_row_tokens": arguments.pack_row_tokens if arguments.pack else None,
               "pack_padding_target": arguments.pack_padding_target if arguments.pack else None,
               "attention_query_chunk_tokens": arguments.attention_query_chunk})
    group_size = min(8, episodes)
    return RunConfig.model_validate({
        "model": {**shape.config.model_dump(), "max_seq_len": arguments.tokens},
        "algorithm": {"name": "grpo", "kl": {}},
        "rollout": {"groups_per_step": episodes // group_size, "group_size": group_size},
        "sft_batch_size": 1,
        "memory": memory,
    }).model_dump(mode="json")


def _measure(model: str, episodes: int, arguments: argparse.Namespace, *, unchunked: bool) -> dict:
    """In this process: one compiled and one timed update of ``episodes`` episodes."""
    import jax
    import numpy as np
    from flax import nnx

    import tandem.configs.memory_plan as plans
    from bench.train_step import MODEL_SIZES
    from policy import Transformer
    from tandem.configs.algorithm import AlgorithmConfig
    from tandem.configs.memory import micro_batch_rows
    from tandem.configs.run import RunConfig
    from tandem.runtime.resource_usage import release_free_pages
    from trainer import algorithms
    from trainer.algorithms import ReferencePolicy, build_algorithm
    from trainer.token_statistics import logits_token_statistics
    from trainer.train_batch import pack_batch, pad_batch
    from trainer.train_state import create_train_state, make_optimizer
    from trainer.train_step import computed_slots, make_train_step

    shape = MODEL_SIZES[model]
    config = RunConfig.model_validate(_run_config(model, episodes, arguments, unchunked=unchunked))
    transformer = shape.transformer(config.model)
    # The plan reads the architecture from a checkpoint's config.json; here it is the shape's, vocabulary included.
    architecture = plans.architecture(_run_config(model, episodes, arguments, unchunked=unchunked)["model"])
    plans.architecture = lambda model_config: dataclasses.replace(
        architecture, vocab_size=shape.vocab_size, qk_norm=transformer.qk_norm,
        post_sublayer_norms=transformer.post_sublayer_norms)
    # As the platform plans it for a trainer that reports this device's platform (none on a CPU).
    platform = jax.devices()[0].platform
    plan = plans.trainer_memory_plan(_run_config(model, episodes, arguments, unchunked=unchunked),
                                     device_platform=None if platform == "cpu" else platform)
    available = _available_memory_bytes()
    if unchunked and plan.peak_bytes > available:
        # Run, it would only be killed for memory, and might take other processes with it.
        return {"skipped": "does not fit: its plan exceeds this machine's available memory",
                "planned_peak_bytes": plan.peak_bytes, "available_bytes": available}
    if unchunked:
        def full_logits(model, batch, *, temperature=1.0, chunk_tokens, remat="none", query_chunk=None):
            hidden = model.hidden_states(batch.tokens, batch.positions, batch.attention_mask)
            return logits_token_statistics(model.logits(hidden), batch.tokens, temperature=temperature), hidden

        algorithms.policy_token_statistics = full_logits
    algorithm = build_algorithm(AlgorithmConfig.model_validate(config.algorithm.model_dump()),
                                temperature=1.0, max_policy_tokens=arguments.tokens,
                                logits_chunk_tokens=config.memory.logits_chunk_tokens, remat=config.memory.remat,
                                micro_batch_tokens=config.memory.micro_batch_tokens,
                                attention_query_chunk=config.memory.attention_query_chunk_tokens)
    optimizer = make_optimizer(1e-5, config.optimizer)
    graphdef, state = create_train_state(Transformer(transformer, rngs=nnx.Rngs(0)), optimizer)
    reference = ReferencePolicy(graphdef, jax.tree.map(lambda leaf: leaf.copy(), state.params))
    release_free_pages()  # as the trainer's Learner does once its state is built

    rng = np.random.default_rng(episodes)
    sequences, masks, behaviour = [], [], []
    for _ in range(episodes):
        length = int(rng.integers(arguments.tokens // 4, arguments.tokens + 1))
        prompt = length // 5
        sequences.append(rng.integers(0, shape.sampled_ids, length).tolist())
        masks.append([0] * prompt + [1] * (length - prompt))
        behaviour.append([0.0] * prompt + (-rng.exponential(2.0, length - prompt)).tolist())
    advantages = rng.standard_normal(episodes).tolist()
    if arguments.pack and not unchunked:
        batch = pack_batch(sequences, loss_masks=masks, behaviour_logprobs=behaviour, advantages=advantages,
                           length_buckets=(arguments.tokens,), pad_id=0,
                           row_tokens=config.memory.pack_row_tokens,
                           padding_target=config.memory.pack_padding_target,
                           micro_batch_tokens=config.memory.micro_batch_tokens)
    else:
        batch = pad_batch(sequences, loss_masks=masks, behaviour_logprobs=behaviour, advantages=advantages,
                          batch_size=episodes, length_buckets=(arguments.tokens,), pad_id=0)
    batch = batch.replace(extras={"reference_logprobs": reference.logprobs(
        batch, temperature=1.0, logits_chunk_tokens=config.memory.logits_chunk_tokens,
        micro_batch_tokens=config.memory.micro_batch_tokens)})
    step = make_train_step(graphdef, optimizer, algorithm.loss_fn, micro_batch_tokens=config.memory.micro_batch_tokens)
    # Compiled ahead rather than by a first update: at 256 episodes an update takes most of an hour here.
    started = time.perf_counter()
    compiled_step = step.compiled(state, batch)
    compile_s = time.perf_counter() - started
    # The high-water mark so far (the compilation's included), then reset: the step's own comes next.
    compile_peak = _resident_high_water_mark(reset=True)
    started = time.perf_counter()
    state, metrics = compiled_step(state, batch)
    jax.block_until_ready(metrics)
    wall_s = time.perf_counter() - started
    tokens = sum(len(sequence) for sequence in sequences)
    device = jax.devices()[0].memory_stats() or {}
    device_peak = device.get("peak_bytes_in_use", 0) + device.get("peak_bytes_reserved", 0)
    analysis = compiled_step.memory_analysis()
    return {
        "peak_bytes": int(device_peak or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024),
        # XLA's own account of the compiled update: its temporaries (gradients, activations, logits
        # chunks), arguments, outputs and code; and the plan's parts, to tell which term is off.
        "compiled_memory": {name: int(getattr(analysis, f"{name}_size_in_bytes")) for name in (
            "temp", "argument", "output", "alias", "generated_code")} if analysis is not None else None,
        "planned_parts": {name: value for name, value in dataclasses.asdict(plan).items() if name.endswith("_bytes")},
        "peak_source": "device_in_use_and_reserved" if device_peak else "process_rss",
        # On a CPU: the process's high-water mark up to the compiled step, and during the step alone.
        "compile_peak_bytes": compile_peak,
        "step_peak_bytes": _resident_high_water_mark(reset=False),
        "device_memory_stats": {key: device[key] for key in ("peak_bytes_in_use", "peak_bytes_reserved",
                                                              "bytes_limit") if key in device},
        "planned_peak_bytes": plan.peak_bytes,
        "tokens_per_s": tokens / wall_s,
        "step_s": wall_s,
        "compile_s": compile_s,
        "padding_fraction": 1.0 - tokens / computed_slots(batch, config.memory.micro_batch_tokens),
        "rows": int(batch.tokens.shape[0]),
        # As the step splits this batch (the plan counts a row per episode).
        "row_tokens": int(batch.tokens.shape[1]),
        "micro_batches": -(-int(batch.tokens.shape[0]) // micro_batch_rows(
            int(batch.tokens.shape[0]), int(batch.tokens.shape[1]), config.memory.micro_batch_tokens)),
        "loss": float(metrics["loss"]),
    }


def _resident_high_water_mark(*, reset: bool) -> int | None:
    """This process's resident high-water mark (``VmHWM``), reset after reading with ``reset``; None
    where /proc does not tell it. Writing 5 to ``clear_refs`` resets it (Linux 4.0 and later)."""
    try:
        status = Path("/proc/self/status").read_text()
        peak = next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM:"))
        if reset:
            Path("/proc/self/clear_refs").write_text("5")
    except (OSError, StopIteration):
        return None
    return peak


def _available_memory_bytes() -> int:
    """MemAvailable of /proc/meminfo (what can be allocated without swapping or killing)."""
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def _producer_warmup(model: str, arguments: argparse.Namespace, *, cache_dir: str, engines: int) -> dict:
    """In this process: ``engines`` engines of ``model`` one after the other, each warmed up and closed."""
    from flax import nnx

    from bench.train_step import MODEL_SIZES
    from policy import InferenceEngine, Transformer, enable_compilation_cache, split_model
    from tandem.configs.rollout import SamplingConfig
    from tandem.configs.run import ModelConfig

    enable_compilation_cache(cache_dir)
    shape = MODEL_SIZES[model]
    config = shape.transformer(ModelConfig(**{**shape.config.model_dump(), "max_seq_len": arguments.tokens}))
    graphdef, params = split_model(Transformer(config, rngs=nnx.Rngs(0)))
    warmups = []
    for _ in range(engines):
        engine = InferenceEngine(graphdef, config=config, eos_id=-1, pad_id=0, num_slots=arguments.producer_slots,
                                 chunk_size=SamplingConfig().decode_chunk_tokens, background=False)
        engine.set_params(params, version=1)
        started = time.perf_counter()
        engine.warmup()
        warmups.append(time.perf_counter() - started)
        engine.close()
    return {"warmup_s": warmups, "peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def _producer_in_children(model: str, arguments: argparse.Namespace) -> dict:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="tandem-jax-cache-") as cache_dir:
        first = _child(["--child", json.dumps({"producer": model, "cache_dir": cache_dir, "engines": 2})], arguments)
        again = _child(["--child", json.dumps({"producer": model, "cache_dir": cache_dir, "engines": 1})], arguments)
    if "error" in first or "error" in again:
        return {"error": first.get("error") or again.get("error")}
    return {"warmup_s": {"first": first["warmup_s"][0], "second": first["warmup_s"][1],
                         "new_process": again["warmup_s"][0]},
            "peak_bytes": first["peak_bytes"]}


def _child(extra: list[str], arguments: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, *extra, "--tokens", str(arguments.tokens),
               "--producer-slots", str(arguments.producer_slots)]
    finished = subprocess.run(command, capture_output=True, text=True)
    if finished.returncode != 0:
        return {"error": f"exit {finished.returncode}: {finished.stderr.strip().splitlines()[-1:]}"}
    return json.loads(finished.stdout.strip().splitlines()[-1])


def _in_child(model: str, episodes: int, arguments: argparse.Namespace, *, unchunked: bool) -> dict:
    command = [sys.executable, __file__, "--child", json.dumps({"model": model, "episodes": episodes,
                                                                 "unchunked": unchunked}),
               "--tokens", str(arguments.tokens), "--micro-batch-tokens", str(arguments.micro_batch_tokens),
               "--remat", arguments.remat, "--logits-chunk-tokens", str(arguments.logits_chunk_tokens),
               *(["--pack"] if arguments.pack else []),
               *(["--pack-row-tokens", str(arguments.pack_row_tokens)] if arguments.pack_row_tokens else []),
               *(["--pack-padding-target", str(arguments.pack_padding_target)]
                 if arguments.pack_padding_target is not None else []),
               *(["--attention-query-chunk", str(arguments.attention_query_chunk)]
                 if arguments.attention_query_chunk else [])]
    finished = subprocess.run(command, capture_output=True, text=True)
    if finished.returncode != 0:
        # Killed for memory (-9) or failed: recorded, not hidden.
        return {"error": f"exit {finished.returncode}: {finished.stderr.strip().splitlines()[-1:]}"}
    return json.loads(finished.stdout.strip().splitlines()[-1])


def _progress(model: str, what, result: dict) -> dict:
    # Each measurement as it ends, on stderr: a long run's results survive its interruption.
    print(json.dumps({"model": model, "measured": str(what), **result}), file=sys.stderr, flush=True)
    return result


def main(argv=None) -> None:
    arguments = _arguments(argv)
    if arguments.child:
        # Should a measurement outgrow the machine, the kernel kills it rather than another process.
        Path("/proc/self/oom_score_adj").write_text("1000")
        job = json.loads(arguments.child)
        if "producer" in job:
            print(json.dumps(_producer_warmup(job["producer"], arguments, cache_dir=job["cache_dir"],
                                              engines=job["engines"])))
        else:
            print(json.dumps(_measure(job["model"], job["episodes"], arguments, unchunked=job["unchunked"])))
        return
    counts = [int(count) for count in arguments.episodes.split(",")]
    sizes, unchunked, producers = {}, {}, {}
    for model in arguments.models.split(","):
        if arguments.producers:
            producers[model] = _progress(model, "producer", _producer_in_children(model, arguments))
        sizes[model] = {str(count): _progress(model, count, _in_child(model, count, arguments, unchunked=False))
                        for count in counts}
        unchunked[model] = {str(count): _progress(model, f"{count} unchunked",
                                                  _in_child(model, count, arguments, unchunked=True))
                            for count in counts if count <= arguments.unchunked_max}
    print(json.dumps({
        "bench": "train_memory", "tokens": arguments.tokens, "micro_batch_tokens": arguments.micro_batch_tokens,
        "remat": arguments.remat, "logits_chunk_tokens": arguments.logits_chunk_tokens, "pack": arguments.pack,
        "pack_row_tokens": arguments.pack_row_tokens, "pack_padding_target": arguments.pack_padding_target,
        "sizes": sizes, "unchunked": unchunked,
        "producer_warmup_s": {model: result.get("warmup_s", result) for model, result in producers.items()},
        "producer_peak_bytes": {model: result.get("peak_bytes") for model, result in producers.items()},
        "producer_slots": arguments.producer_slots,
    }))


if __name__ == "__main__":
    main()
