"""A run's memory plan, from its config alone: what each part of the trainer and a producer engine takes."""

from __future__ import annotations

import dataclasses

import pytest

from tandem.configs.memory_plan import (
    OVERHEAD_BYTES,
    check_trainer_memory,
    lora_parameter_count,
    memory_plan,
    trainer_memory_plan,
)
from tandem.configs.quotas import QuotaExceeded, architecture, parameter_count
from tandem.configs.run import RunConfig

# SmolLM2-135M-Instruct's architecture (its config.json), written out so that no checkpoint is needed.
SMOLLM2 = {"d_model": 576, "num_layers": 30, "num_heads": 9, "num_kv_heads": 3, "mlp_dim": 1536,
           "tie_embeddings": True, "max_seq_len": 1024}


def _config(**sections) -> dict:
    return RunConfig.model_validate({"model": SMOLLM2, "sft_batch_size": 4, **sections}).model_dump(mode="json")


def _smollm2_architecture():
    # Without a checkpoint to read, the config's byte vocabulary would stand in: SmolLM2's is 49,152.
    return dataclasses.replace(architecture(_config()["model"]), vocab_size=49152)


def _smollm2_plan(monkeypatch, **sections):
    import tandem.configs.memory_plan as plans

    monkeypatch.setattr(plans, "architecture", lambda model: _smollm2_architecture())
    return trainer_memory_plan(_config(**sections))


def test_smollm2s_weights_gradients_adam_and_reference_are_the_2_7_gb_of_the_issue(monkeypatch):
    plan = _smollm2_plan(monkeypatch, algorithm={"kl": {}}, rollout={"groups_per_step": 8, "group_size": 8})

    fixed = plan.parameters_bytes + plan.gradients_bytes + plan.optimizer_bytes + plan.reference_bytes
    assert plan.trained_parameters == 134_515_008
    assert fixed == 5 * 4 * 134_515_008  # weights, gradients, two moments and the reference, float32
    assert plan.batch_rows == 64 and plan.micro_batches == 1 and plan.length_tokens == 1024
    assert plan.peak_bytes > OVERHEAD_BYTES + fixed + plan.activations_bytes


def test_micro_batches_bound_the_activations_whatever_the_batch(monkeypatch):
    budget = {"micro_batch_tokens": 4 * 1024}
    small = _smollm2_plan(monkeypatch, memory=budget, rollout={"groups_per_step": 2, "group_size": 8})
    large = _smollm2_plan(monkeypatch, memory=budget, rollout={"groups_per_step": 32, "group_size": 8})
    whole = _smollm2_plan(monkeypatch, rollout={"groups_per_step": 32, "group_size": 8})

    assert (small.micro_batch_rows, small.micro_batches) == (4, 4)
    assert (large.micro_batch_rows, large.micro_batches) == (4, 64)
    assert large.activations_bytes == small.activations_bytes < whole.activations_bytes / 50
    # The float32 accumulator of the gradients is what micro-batching costs.
    assert large.gradients_bytes == whole.gradients_bytes + 4 * whole.trained_parameters


def test_remat_keeps_less_and_lora_trains_less(monkeypatch):
    plans = {remat: _smollm2_plan(monkeypatch, memory={"remat": remat}) for remat in ("none", "save_matmuls", "full")}
    assert plans["full"].activations_bytes < plans["save_matmuls"].activations_bytes < plans["none"].activations_bytes
    # Rows of 1,024 attending 256 queries at a time hold a quarter of the scores.
    chunked = _smollm2_plan(monkeypatch, memory={"attention_query_chunk_tokens": 256})
    scores_per_token = 30 * 9 * (1024 - 256)
    assert plans["none"].activations_bytes - chunked.activations_bytes == plans["none"].batch_rows * 1024 * scores_per_token * 4

    lora = _smollm2_plan(monkeypatch, lora={"enabled": True, "rank": 8, "targets": ["attention.query", "mlp.up"]})
    arch = _smollm2_architecture()
    assert lora.trained_parameters == lora_parameter_count(arch, {"rank": 8, "targets": ["attention.query", "mlp.up"]})
    assert lora.trained_parameters == 30 * 8 * ((576 + 576) + (576 + 1536))
    assert lora.optimizer_bytes == 2 * 4 * lora.trained_parameters
    assert lora.parameters_bytes == 4 * parameter_count(arch) == plans["none"].parameters_bytes


def test_on_a_tpu_the_plan_counts_one_logits_buffer_where_elsewhere_it_counts_three(monkeypatch):
    """XLA on a TPU fuses a chunk's softmax and its gradient into its logits (measured, bench/README.md);
    a CPU, a GPU (not measured) and an unknown device keep the three buffers."""
    import tandem.configs.memory_plan as plans

    monkeypatch.setattr(plans, "architecture", lambda model: _smollm2_architecture())
    config = _config(memory={"micro_batch_tokens": 8192, "logits_chunk_tokens": 2048})
    tpu, gpu, unknown = (trainer_memory_plan(config, device_platform=platform) for platform in ("tpu", "gpu", None))

    assert unknown.logits_bytes == 3 * 4 * 49152 * 2048 and unknown.logits_buffers == 3
    assert (gpu.logits_bytes, gpu.peak_bytes) == (unknown.logits_bytes, unknown.peak_bytes)
    assert tpu.logits_buffers == 1 and tpu.logits_bytes == unknown.logits_bytes // 3
    assert tpu.peak_bytes < unknown.peak_bytes and tpu.activations_bytes == unknown.activations_bytes
    assert memory_plan(config, worker_concurrency=1, trainer_platform="tpu").trainer == tpu


def test_a_plan_over_the_trainers_memory_names_the_setting_that_shrinks_it(monkeypatch):
    plan = _smollm2_plan(monkeypatch, rollout={"groups_per_step": 32, "group_size": 8})
    check_trainer_memory(plan, limit_bytes=None, setting="TANDEM_TRAINER_MEMORY_BYTES")
    check_trainer_memory(plan, limit_bytes=plan.peak_bytes, setting="TANDEM_TRAINER_MEMORY_BYTES")

    with pytest.raises(QuotaExceeded, match="TANDEM_TRAINER_MEMORY_BYTES") as activations:
        check_trainer_memory(plan, limit_bytes=plan.peak_bytes - 1, setting="TANDEM_TRAINER_MEMORY_BYTES")
    assert activations.value.field == "config.memory.micro_batch_tokens"

    # One episode a micro-batch, each block recomputed: what is left is the weights' and Adam's.
    bounded = _smollm2_plan(monkeypatch, memory={"micro_batch_tokens": 1024, "remat": "full"})
    with pytest.raises(QuotaExceeded) as weights:
        check_trainer_memory(bounded, limit_bytes=2**30, setting="TANDEM_TRAINER_MEMORY_BYTES")
    assert weights.value.field == "config.lora.enabled"


def test_the_producer_plan_holds_the_weights_and_the_kv_cache_of_its_slots():
    config = RunConfig.model_validate({"sampling": {"inference_slots": 16}}).model_dump(mode="json")
    producer = memory_plan(config, worker_concurrency=4).producer
    arch = architecture(config["model"])

    assert producer.slots == 16
    assert producer.weights_bytes == 4 * parameter_count(arch)
    assert producer.kv_cache_bytes == 16 * 2 * arch.num_layers * arch.num_kv_heads * arch.head_dim * (
        config["model"]["max_seq_len"] + 1) * 4


def test_micro_batches_leave_the_fewest_empty_rows_the_budget_allows():
    from tandem.configs.memory import budget_rows, micro_batch_rows

    # From the budget's rows down to half of it, the count whose last micro-batch is fullest.
    assert micro_batch_rows(10, 1024, 8 * 1024) == 5  # 2 of 5, not 2 of 8 (6 empty rows)
    assert micro_batch_rows(44, 1024, 8 * 1024) == 4  # 11 of 4, where 6 of 8 compute 4 empty rows
    assert micro_batch_rows(7, 16, 4 * 16) == 4  # none divides 7: the largest of the fewest empty rows
    assert micro_batch_rows(10, 16, 3 * 16) == 2
    # Data-parallel ways: only multiples of them, where the budget holds one.
    assert micro_batch_rows(12, 16, 8 * 16, multiple=2) == 6
    assert micro_batch_rows(12, 16, 2 * 16, multiple=4) == 2
    # Within the budget, and whole when it fits.
    assert micro_batch_rows(6, 16, 8 * 16) == 6 and micro_batch_rows(6, 16, None) == 6
    assert budget_rows(10, 1024, 8 * 1024) == 8 and budget_rows(10, 1024, 100) == 1


def test_packed_rows_longer_than_the_longest_episode_are_what_a_micro_batch_holds(monkeypatch):
    rollout = {"groups_per_step": 2, "group_size": 8}
    in_buckets = _smollm2_plan(monkeypatch, rollout=rollout,
                               memory={"pack_episodes": True, "micro_batch_tokens": 4096})
    in_longer_rows = _smollm2_plan(monkeypatch, rollout=rollout,
                                   memory={"pack_episodes": True, "pack_row_tokens": 1408, "micro_batch_tokens": 4096})
    assert (in_buckets.length_tokens, in_buckets.micro_batch_rows) == (1024, 4)
    assert (in_longer_rows.length_tokens, in_longer_rows.micro_batch_rows) == (1408, 2)
    # Unpacked, the setting cannot be given; packed rows shorter than an episode give way to its length.
    with pytest.raises(ValueError, match="memory.pack_row_tokens .* needs memory.pack_episodes true"):
        _config(memory={"pack_row_tokens": 1408})
    shorter = _smollm2_plan(monkeypatch, memory={"pack_episodes": True, "pack_row_tokens": 512})
    assert shorter.length_tokens == 1024
    # A padding target may grow rows to 1.5 times the longest episode: the plan counts the longest.
    targeted = _smollm2_plan(monkeypatch, memory={"pack_episodes": True, "pack_padding_target": 0.1})
    assert targeted.length_tokens == 1536
    with pytest.raises(ValueError, match="set one of them"):
        _config(memory={"pack_episodes": True, "pack_row_tokens": 1408, "pack_padding_target": 0.1})
    with pytest.raises(ValueError, match="memory.pack_padding_target .* needs memory.pack_episodes true"):
        _config(memory={"pack_padding_target": 0.1})
