"""Sharded train steps: every parameter gets its spec, and the result equals one device's.

The sharded runs need 4 devices, which on CPU exist only if XLA_FLAGS is set
before JAX starts; this pytest process has started JAX already with one. So
the test runs this very file as a script in a fresh interpreter (nothing at
module level touches a device, so the flag still applies there), which
prints one JSON line that the test checks.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import redis
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P

from policy.lora import apply_lora
from policy.model import Transformer, TransformerConfig
from policy.weights import RedisWeightPublisher, weight_publisher
from tandem.configs.parallelism import LoRAConfig, MeshConfig
from tandem.contracts import weights_key
from trainer.checkpoints import RunCheckpointer, RunProgress
from trainer.losses import sft_loss
from trainer.sharding import (
    MESH_AXES,
    initialize_distributed,
    make_mesh,
    partition_spec,
    path_name,
    shard_batch,
    shard_train_state,
    step_shardings,
)
from trainer.train_batch import pad_batch
from trainer.train_state import create_train_state
from trainer.train_step import make_train_step, on_token_statistics

REPO_ROOT = Path(__file__).resolve().parents[2]
# Children compile a handful of small SPMD programs; unoptimized CPU code
# compiles about twice as fast and is compared only with itself.
FAST_COMPILE = "--xla_backend_optimization_level=0"
# (mesh, LoRA) pairs run; LoRA on the tensor-parallel mesh only, to keep compiles few.
RUNS = (((2, 2, 1), False), ((1, 2, 2), False), ((1, 2, 2), True))
STEPS = 3
# Sharded matmuls sum in another order; after 3 SGD steps parameters agree to this.
ATOL = 2e-6


def _normal(spec) -> list:
    """A spec as JSON-able list without trailing Nones (P('fsdp', None) == P('fsdp'))."""
    entries = [list(axes) if isinstance(axes, tuple) else axes for axes in spec]
    while entries and entries[-1] is None:
        entries.pop()
    return entries


def _expected_spec(path: str, mesh_shape: tuple[int, int, int]) -> list:
    """Hand-written layout of the test model (all dimensions divide the axes)."""
    sizes = dict(zip(MESH_AXES, mesh_shape, strict=True))

    def keep(*axes):
        return _normal(P(*(axis if axis and sizes[axis] > 1 else None for axis in axes)))

    leaf = path.rsplit("/", 1)[-1]
    column = any(f"/{name}/" in path for name in ("query", "key", "value", "gate", "up"))
    row = any(f"/{name}/" in path for name in ("output", "down"))
    if path.endswith("embedding/embedding"):
        return keep("tensor", "fsdp")
    if path.endswith("head/kernel"):
        return keep("fsdp", "tensor")
    if column:
        return {"kernel": keep("fsdp", "tensor"), "lora_a": keep("fsdp", None),
                "lora_b": keep(None, "tensor")}[leaf]
    if row:
        return {"kernel": keep("tensor", "fsdp"), "lora_a": keep("tensor", None),
                "lora_b": keep(None, "fsdp")}[leaf]
    return []  # norms, step, optimizer scalars


@pytest.fixture(scope="module")
def sharded_report() -> dict:
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4 " + FAST_COMPILE,
           "JAX_PLATFORMS": "cpu"}
    completed = subprocess.run(
        [sys.executable, "-m", "tests.trainer.test_sharding"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    return json.loads(completed.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("mesh_shape", "lora"), RUNS,
    ids=[f"{'x'.join(map(str, mesh))}-{'lora' if lora else 'full'}" for mesh, lora in RUNS],
)
def test_sharded_steps_lay_out_every_parameter_and_match_one_device(sharded_report, mesh_shape, lora):
    run = sharded_report["runs"][f"{'x'.join(map(str, mesh_shape))}-{'lora' if lora else 'full'}"]
    assert run["device_count"] == 4
    assert run["trace_count"] == 1
    # Batch rows are split over data x fsdp.
    assert run["batch_spec"] == [["data", "fsdp"]]
    # Parameters and optimizer state (SGD momentum, same paths under a prefix).
    assert any("/lora_a" in path for path in run["state_specs"]) == lora
    assert any(path.startswith("opt_state/") for path in run["state_specs"])
    for path, spec in run["state_specs"].items():
        assert spec == _expected_spec(path, mesh_shape), path
    # Output shardings are pinned: a step returns the layout it was given.
    assert run["output_layout_unchanged"]
    assert run["max_abs_diff_to_one_device"] <= ATOL, run["max_abs_diff_to_one_device"]
    # Micro-batches of one row, accumulated across the mesh: the same parameters.
    assert run["micro_batches_max_abs_diff_to_one_device"] <= ATOL, run["micro_batches_max_abs_diff_to_one_device"]
    assert run["remat_micro_batches_max_abs_diff_to_one_device"] <= ATOL, \
        run["remat_micro_batches_max_abs_diff_to_one_device"]
    if lora:
        assert run["base_unchanged"]


def test_micro_batches_reduce_gradients_over_the_data_axis_once_per_step(sharded_report):
    """On a data x fsdp mesh, the collectives inside the micro-batch loop are fsdp's alone (gathering
    parameters, reduce-scattering gradients within a data shard); the reduction over ``data`` is outside
    it, once per step. Before, every micro-batch's gradients were all-reduced over all four devices."""
    layout = sharded_report["reductions"]
    assert layout["micro_batches"] == 2
    assert layout["max_abs_diff_to_one_device"] <= ATOL, layout["max_abs_diff_to_one_device"]
    assert layout["loop_collectives"], "no collective in the loop: fsdp's gathers are expected there"
    assert all(groups == layout["fsdp_groups"] for groups in layout["loop_collectives"]), layout
    assert layout["data_groups"] in layout["step_collectives"], layout


@pytest.mark.parametrize("case", ["ppo_kl", "grpo_lora", "dr_grpo_kl"])
def test_each_algorithm_steps_alike_in_one_batch_and_in_micro_batches_on_a_data_mesh(sharded_report, case):
    """PPO with its value head and the KL penalty, GRPO with LoRA, Dr. GRPO with the KL penalty: three
    micro-batches on a (2, 2, 1) mesh, reduced over data once, give one device's step in one batch."""
    compared = sharded_report["algorithms"][case]
    assert compared["micro_batches"] == 3
    assert compared["max_abs_param_diff"] <= 1e-5, compared
    assert compared["max_abs_metric_diff"] <= 1e-5, compared
    assert compared["grad_norm"] > 0


def test_a_sharded_state_restores_from_a_checkpoint_onto_its_layout(sharded_report):
    assert sharded_report["checkpoint"] == {"same_layout": True, "same_values": True}


def test_axes_that_do_not_divide_a_dimension_fall_back_to_replication():
    mesh = AbstractMesh((1, 2, 2), MESH_AXES)
    # A byte vocabulary of 259 ids cannot be split in two; d_model 32 can.
    assert partition_spec("embedding/embedding", (259, 32), mesh) == P(None, "fsdp")
    assert partition_spec("head/kernel", (32, 259), mesh) == P("fsdp", None)
    assert partition_spec("opt_state/0/mu/blocks/3/mlp/down/kernel", (64, 32), mesh) == P(
        "tensor", "fsdp"
    )
    assert partition_spec("blocks/0/attention_norm/scale", (32,), mesh) == P()


def test_mesh_config_fills_the_remaining_axis_and_refuses_what_does_not_fit():
    assert MeshConfig().axis_sizes(8) == (8, 1, 1)
    assert MeshConfig(data=1, fsdp=-1, tensor=2).axis_sizes(8) == (1, 4, 2)
    with pytest.raises(ValueError, match="needs 4 devices"):
        MeshConfig(data=2, fsdp=2, tensor=1).axis_sizes(8)
    with pytest.raises(ValueError, match="at most one"):
        MeshConfig(data=-1, fsdp=-1)


def test_two_processes_join_one_mesh_and_only_process_zero_publishes(redis_url, redis_client, run_id):
    """Two local processes stand in for two hosts of 2 devices each."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": "--xla_force_host_platform_device_count=2 " + FAST_COMPILE}
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.trainer.test_sharding", "process", str(process_id),
             str(port), str(run_id), redis_url],
            cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for process_id in (0, 1)
    ]
    reports = []
    for child in children:
        stdout, stderr = child.communicate(timeout=180)
        assert child.returncode == 0, stderr[-4000:]
        # Gloo writes progress lines to stdout; the report is the last line.
        reports.append(json.loads(stdout.strip().splitlines()[-1]))
    redis_client.delete(weights_key(run_id))

    assert [report["process"] for report in reports] == [0, 1]
    assert all(report["devices"] == 4 and report["local_devices"] == 2 for report in reports)
    assert reports[0]["loss"] == reports[1]["loss"]
    # Micro-batches whose gradients the two processes accumulate give the whole batch's step.
    assert all(abs(report["micro_batches_loss"] - report["loss"]) <= ATOL for report in reports)
    assert all(report["micro_batches_max_abs_diff"] <= ATOL for report in reports)
    base_and_adapters, adapters_only = reports[0]["published_bytes"]
    assert 0 < adapters_only < base_and_adapters
    assert reports[1]["published_bytes"] == [0, 0]
    # The filesystem transport cannot gather across hosts yet: refused before anything is written.
    assert all("not supported by a trainer of 2 processes" in report["filesystem_refused"] for report in reports)


def test_initialize_distributed_is_a_no_op_on_a_single_host(monkeypatch):
    for name in ("TANDEM_COORDINATOR_ADDRESS", "TANDEM_NUM_PROCESSES", "TANDEM_PROCESS_ID"):
        monkeypatch.delenv(name, raising=False)
    assert initialize_distributed() is False
    assert initialize_distributed(num_processes=1) is False


def _sharded_runs() -> dict:
    """Child process: the sharded runs, with 4 host devices."""
    config = TransformerConfig(
        vocab_size=64, d_model=32, num_layers=1, num_heads=4, mlp_dim=64, max_seq_len=32
    )
    lora_config = LoRAConfig(enabled=True, rank=4, targets=["attention.query", "attention.output",
                                                             "mlp.up", "mlp.down"])
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1, momentum=0.9))

    def batch(step: int):
        rng = np.random.default_rng(step)
        sequences = [rng.integers(1, 64, size=int(rng.integers(6, 16))).tolist() for _ in range(4)]
        return pad_batch(sequences, loss_masks=[[0] + [1] * (len(s) - 1) for s in sequences],
                         behaviour_logprobs=None, advantages=None, batch_size=4,
                         length_buckets=(16,), pad_id=0)

    def initial_state(lora: bool):
        model = Transformer(config, rngs=nnx.Rngs(0))
        if lora:
            apply_lora(model, lora_config, rngs=nnx.Rngs(1))
            # Nonzero B, so adapters shape the output from the first step.
            for block in model.blocks:
                block.mlp.up.lora_b[...] = 0.01 * jax.numpy.ones_like(block.mlp.up.lora_b[...])
        return create_train_state(model, optimizer)

    initial = {lora: initial_state(lora) for lora in (False, True)}

    def fresh_state(lora: bool):
        # A copy: steps donate their state.
        graphdef, state = initial[lora]
        return graphdef, jax.tree.map(jnp.copy, state)

    def flat(state):
        leaves = jax.tree_util.tree_flatten_with_path(state)[0]
        return {path_name(keypath): leaf for keypath, leaf in leaves}

    references = {}
    for lora in (False, True):
        graphdef, state = fresh_state(lora)
        reference_step = make_train_step(graphdef, optimizer, on_token_statistics(sft_loss))
        for step in range(STEPS):
            state, _ = reference_step(state, batch(step))
        references[lora] = {path: np.asarray(leaf) for path, leaf in flat(state.params).items()}

    runs = {}
    for mesh_shape, lora in RUNS:
        reference = references[lora]
        data, fsdp, tensor = mesh_shape
        mesh = make_mesh(MeshConfig(data=data, fsdp=fsdp, tensor=tensor))
        graphdef, state = fresh_state(lora)
        base_before = {path: np.asarray(leaf) for path, leaf in flat(state.params).items()
                       if "lora" not in path}
        shardings = step_shardings(mesh, state)
        state = shard_train_state(state, shardings)
        layout = {path: leaf.sharding for path, leaf in flat(state).items()}
        train_step = make_train_step(graphdef, optimizer, on_token_statistics(sft_loss), shardings=shardings)
        # The same steps in micro-batches of one row (16 tokens), their gradients accumulated on the mesh.
        micro_step = make_train_step(graphdef, optimizer, on_token_statistics(sft_loss), shardings=shardings,
                                     micro_batch_tokens=16)
        micro_state = shard_train_state(fresh_state(lora)[1], shardings)
        # And once more with every block rematerialised (its backward pass in a conditional on CPU).
        remat_step = make_train_step(graphdef, optimizer, on_token_statistics(sft_loss, remat="full"),
                                     shardings=shardings, micro_batch_tokens=16)
        remat_state = shard_train_state(fresh_state(lora)[1], shardings)
        for step in range(STEPS):
            sharded_batch = shard_batch(batch(step), shardings)
            state, metrics = train_step(state, sharded_batch)
            micro_state, _ = micro_step(micro_state, shard_batch(batch(step), shardings))
            remat_state, _ = remat_step(remat_state, shard_batch(batch(step), shardings))
        jax.block_until_ready(state)
        params = flat(state.params)
        micro_params = flat(micro_state.params)
        remat_params = flat(remat_state.params)
        runs[f"{data}x{fsdp}x{tensor}-{'lora' if lora else 'full'}"] = {
            "device_count": jax.device_count(),
            "trace_count": train_step.trace_count,
            "batch_spec": _normal(sharded_batch.tokens.sharding.spec),
            "state_specs": {path: _normal(leaf.sharding.spec) for path, leaf in flat(state).items()},
            "output_layout_unchanged": all(
                leaf.sharding == layout[path] for path, leaf in flat(state).items()
            ),
            "max_abs_diff_to_one_device": max(
                float(np.max(np.abs(np.asarray(leaf) - reference[path])))
                for path, leaf in params.items()
            ),
            "micro_batches_max_abs_diff_to_one_device": max(
                float(np.max(np.abs(np.asarray(leaf) - reference[path])))
                for path, leaf in micro_params.items()
            ),
            "remat_micro_batches_max_abs_diff_to_one_device": max(
                float(np.max(np.abs(np.asarray(leaf) - reference[path])))
                for path, leaf in remat_params.items()
            ),
            "base_unchanged": all(
                np.array_equal(np.asarray(params[path]), value)
                for path, value in base_before.items()
            ),
        }

    # The last (tensor-parallel, LoRA) state through a checkpoint: restored
    # onto the layout of the template, with the same values.
    with tempfile.TemporaryDirectory() as directory:
        checkpointer = RunCheckpointer(Path(directory))
        checkpointer.save(STEPS, train_state=state, progress=RunProgress(step=STEPS))
        checkpointer.wait_until_finished()
        restored, _ = checkpointer.restore_latest(state)
        checkpointer.close()
    saved, loaded = flat(state), flat(restored)
    checkpoint = {
        "same_layout": all(loaded[path].sharding == leaf.sharding for path, leaf in saved.items()),
        "same_values": all(np.array_equal(np.asarray(loaded[path]), np.asarray(leaf))
                           for path, leaf in saved.items()),
    }
    return {"runs": runs, "checkpoint": checkpoint, "reductions": _reduction_layout(config, optimizer),
            "algorithms": _algorithms_on_a_data_mesh()}


def _algorithms_on_a_data_mesh() -> dict:
    """Child process: test_flat_memory_step's algorithm cases, one device's step in one batch against
    the step in micro-batches of 4 rows on a (2, 2, 1) mesh (the batch's 10 rows and 2 empty ones)."""
    from tests.trainer.test_flat_memory_step import BUCKETS, _algorithm_batch

    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=1))
    compared = {}
    for case in ("ppo_kl", "grpo_lora", "dr_grpo_kl"):
        algorithm, graphdef, state, optimizer, batch = _algorithm_batch(case)
        batch = jax.tree.map(lambda values: jnp.pad(values, [(0, 2)] + [(0, 0)] * (values.ndim - 1)), batch)
        whole_state, whole = make_train_step(graphdef, optimizer, algorithm.loss_fn)(
            jax.tree.map(jnp.copy, state), batch)
        shardings = step_shardings(mesh, state)
        step = make_train_step(graphdef, optimizer, algorithm.loss_fn, shardings=shardings,
                               micro_batch_tokens=4 * BUCKETS[0])
        micro_state, micro = step(shard_train_state(jax.tree.map(jnp.copy, state), shardings),
                                  shard_batch(batch, shardings))
        compared[case] = {
            "micro_batches": -(-batch.tokens.shape[0] // 4),
            "max_abs_param_diff": max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(
                jax.tree.leaves(whole_state.params), jax.tree.leaves(micro_state.params), strict=True)),
            "max_abs_metric_diff": max(abs(float(whole[name]) - float(micro[name])) for name in whole),
            "grad_norm": float(whole["grad_norm"]),
        }
    return compared


def _replica_groups(text: str) -> list[list[int]] | None:
    """An HLO collective's ``replica_groups`` (explicit ``{{0,2},{1,3}}``, or iota ``[2,2]<=[4]`` with an
    optional ``T(...)``) as sorted groups of device ids; None for a form this does not read."""
    if text.startswith("{"):
        return sorted(sorted(map(int, group.split(","))) for group in re.findall(r"\{([\d,]+)\}", text))
    iota = re.fullmatch(r"\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?,?", text)
    if iota is None:
        return None
    dims = [int(size) for size in iota.group(3).split(",")]
    ids = np.arange(int(np.prod(dims))).reshape(dims)
    if iota.group(4):
        ids = ids.transpose([int(axis) for axis in iota.group(4).split(",")])
    return sorted(sorted(row) for row in ids.reshape(int(iota.group(1)), int(iota.group(2))).tolist())


def _reduction_layout(config: TransformerConfig, optimizer) -> dict:
    """Child process: where a micro-batched step on a (2, 2, 1) mesh makes its collectives."""
    rng = np.random.default_rng(7)
    sequences = [rng.integers(1, 64, size=int(rng.integers(6, 16))).tolist() for _ in range(8)]
    batch = pad_batch(sequences, loss_masks=[[0] + [1] * (len(s) - 1) for s in sequences],
                      behaviour_logprobs=None, advantages=None, batch_size=8, length_buckets=(16,), pad_id=0)
    graphdef, initial = create_train_state(Transformer(config, rngs=nnx.Rngs(0)), optimizer)
    reference_step = make_train_step(graphdef, optimizer, on_token_statistics(sft_loss))
    reference, _ = reference_step(jax.tree.map(jnp.copy, initial), batch)
    mesh = make_mesh(MeshConfig(data=2, fsdp=2, tensor=1))
    shardings = step_shardings(mesh, initial)
    # Micro-batches of 4 rows of 16 tokens: two a step, each one row of each device's two.
    step = make_train_step(graphdef, optimizer, on_token_statistics(sft_loss), shardings=shardings,
                           micro_batch_tokens=64)
    state = shard_train_state(jax.tree.map(jnp.copy, initial), shardings)
    sharded = shard_batch(batch, shardings)
    program = step._step.lower(state, sharded).compile().as_text()
    state, _ = step(state, sharded)

    ids = np.vectorize(lambda device: device.id)(mesh.devices)  # [data, fsdp, tensor]
    fsdp_groups = sorted(sorted(ids[d, :, 0].tolist()) for d in range(2))
    data_groups = sorted(sorted(ids[:, f, 0].tolist()) for f in range(2))
    loop_bodies = set(re.findall(r"body=%?([\w.\-]+)", program))
    in_loop, in_step, computation = [], [], None
    for line in program.splitlines():
        header = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
        if header:
            computation = header.group(1)
        collective = re.search(r" = .*\b(all-reduce|all-gather|reduce-scatter|all-to-all)(?:-start)?\(", line)
        if collective:
            groups = re.search(r"replica_groups=(\S+)", line)
            parsed = _replica_groups(groups.group(1)) if groups else None
            (in_loop if computation in loop_bodies else in_step).append(parsed)
    return {
        "micro_batches": 2,
        "max_abs_diff_to_one_device": max(
            float(np.max(np.abs(np.asarray(leaf) - np.asarray(expected))))
            for leaf, expected in zip(jax.tree.leaves(state.params), jax.tree.leaves(reference.params), strict=True)),
        "fsdp_groups": fsdp_groups, "data_groups": data_groups,
        "loop_collectives": in_loop, "step_collectives": in_step,
    }


def _one_of_two_processes(process_id: int, port: int, run_id: int, redis_url: str) -> dict:
    """Child process: one of two "hosts" with 2 CPU devices each, on one (2, 1, 2) mesh: its data axis
    spans the two processes, its tensor axis each one's two devices."""
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    assert initialize_distributed(f"127.0.0.1:{port}", 2, process_id)
    lora = LoRAConfig(enabled=True, rank=4, targets=["attention.query", "mlp.down"])
    config = TransformerConfig(
        vocab_size=64, d_model=32, num_layers=1, num_heads=4, mlp_dim=64, max_seq_len=32
    )
    model = apply_lora(Transformer(config, rngs=nnx.Rngs(0)), lora, rngs=nnx.Rngs(1))
    optimizer = optax.sgd(0.1)
    graphdef, state = create_train_state(model, optimizer)
    mesh = make_mesh(MeshConfig(data=2, fsdp=1, tensor=2))
    shardings = step_shardings(mesh, state)
    state = shard_train_state(state, shardings)
    train_step = make_train_step(graphdef, optimizer, on_token_statistics(sft_loss), shardings=shardings)
    rng = np.random.default_rng(0)
    sequences = [rng.integers(1, 64, size=10).tolist() for _ in range(4)]
    batch = pad_batch(sequences, loss_masks=[[0] + [1] * 9] * 4, behaviour_logprobs=None,
                      advantages=None, batch_size=4, length_buckets=(16,), pad_id=0)
    # The same two steps in two micro-batches of one row of each process's, their gradients accumulated
    # in each process and reduced across both once per step.
    micro_step = make_train_step(graphdef, optimizer, on_token_statistics(sft_loss), shardings=shardings,
                                 micro_batch_tokens=32)
    micro_state = shard_train_state(jax.tree.map(jnp.copy, state), shardings)
    for _ in range(2):
        state, metrics = train_step(state, shard_batch(batch, shardings))
        micro_state, micro_metrics = micro_step(micro_state, shard_batch(batch, shardings))
    micro_diff = max(float(jnp.max(jnp.abs(whole - micro))) for whole, micro in zip(
        jax.tree.leaves(multihost_utils.process_allgather(state.params, tiled=True)),
        jax.tree.leaves(multihost_utils.process_allgather(micro_state.params, tiled=True)), strict=True))
    publisher = RedisWeightPublisher(redis.Redis.from_url(redis_url), lora=lora)
    published = [publisher.publish(run_id=run_id, version=version, params=state.params)
                 for version in range(2)]
    try:
        weight_publisher(redis.Redis.from_url(redis_url), transport="filesystem", directory=Path("/nonexistent"))
        filesystem_refused = ""
    except ValueError as refused:
        filesystem_refused = str(refused)
    return {"process": jax.process_index(), "devices": jax.device_count(),
            "local_devices": jax.local_device_count(), "loss": float(metrics["loss"]),
            "micro_batches_loss": float(micro_metrics["loss"]), "micro_batches_max_abs_diff": micro_diff,
            "published_bytes": published, "filesystem_refused": filesystem_refused}


if __name__ == "__main__":
    if sys.argv[1:2] == ["process"]:
        process_id, port, run_id = map(int, sys.argv[2:5])
        print(json.dumps(_one_of_two_processes(process_id, port, run_id, sys.argv[5])))
    else:
        print(json.dumps(_sharded_runs()))
