"""Finding 8 of the security audit: a run config cannot ask more of the shared trainer and workers than the operator allows.

Before, any member could queue d_model 8192 x 128 layers, or 4,096 inference
slots, and run the trainer and every worker out of memory.
"""

from __future__ import annotations

import contextlib
import time

import pytest
import redis

from policy import count_parameters, load_hf_checkpoint
from runs.models import Run
from tandem.configs.quotas import RunQuotas, architecture, check_run_quotas, parameter_count
from tandem.configs.run import RunConfig
from tandem.contracts import ProcessReport, process_reports_key


@pytest.fixture
def quotas(settings):
    settings.TANDEM_RUN_QUOTAS = RunQuotas(max_parameters=50_000_000, max_kv_cache_bytes=2**30,
                                           max_episodes_per_step=256, max_active_runs_per_project=2)
    return settings.TANDEM_RUN_QUOTAS


def _create(api, project, config):
    return api.post("/api/runs/", {"project": project.pk, "environment": "calculator", "config": config},
                    format="json")


@pytest.mark.parametrize(("config", "field", "setting"), [
    ({"model": {"d_model": 8192, "num_layers": 128, "num_heads": 64, "mlp_dim": 32768}},
     "config.model", "TANDEM_MAX_PARAMETERS"),
    ({"sampling": {"inference_slots": 4096}, "model": {"max_seq_len": 4096}},
     "config.sampling.inference_slots", "TANDEM_MAX_KV_CACHE_BYTES"),
    ({"rollout": {"groups_per_step": 64, "group_size": 8}},
     "config.rollout.groups_per_step", "TANDEM_MAX_EPISODES_PER_STEP"),
])
def test_a_config_over_a_cap_is_400_naming_the_cap(api, project, environment, quotas, config,
                                                   field, setting):
    response = _create(api, project, config)

    assert response.status_code == 400, response.json()
    fields = response.json()["error"]["fields"]
    assert list(fields) == [field] and setting in fields[field][0]
    assert not Run.objects.exists()


def test_a_project_cannot_have_more_runs_going_than_the_cap(api, project, environment, quotas):
    for _ in range(2):
        assert _create(api, project, {}).status_code == 201
    third = _create(api, project, {})
    assert third.status_code == 400
    assert "TANDEM_MAX_ACTIVE_RUNS_PER_PROJECT" in third.json()["error"]["fields"]["project"][0]

    Run.objects.filter(project=project).update(status="cancelled")  # ended runs do not count
    assert _create(api, project, {}).status_code == 201


def test_the_default_run_and_the_real_model_fit_the_default_caps(smollm2):
    defaults = RunQuotas()
    check_run_quotas(RunConfig().model_dump(mode="json"), defaults)
    real = RunConfig.model_validate({"model": {"hf_checkpoint": str(smollm2), "tokenizer": str(smollm2)}})
    arch = architecture(real.model_dump(mode="json")["model"])
    assert parameter_count(arch) == 134_515_008  # SmolLM2-135M, read from its config.json
    check_run_quotas(real.model_dump(mode="json"), defaults)


def test_gemma3_is_counted_parameter_for_parameter_from_its_config_json(gemma3):
    arch = architecture({"hf_checkpoint": str(gemma3)})
    assert (arch.qk_norm, arch.post_sublayer_norms, arch.vocab_size) == (True, True, 262_144)
    assert parameter_count(arch) == count_parameters(load_hf_checkpoint(gemma3)) == 268_098_176


def test_a_run_whose_trainer_would_not_fit_is_refused_naming_the_memory_settings(api, project, environment,
                                                                                  settings):
    settings.TANDEM_RUN_QUOTAS = RunQuotas(trainer_memory_bytes=800 * 2**20)
    big_batch = {"rollout": {"groups_per_step": 64, "group_size": 16}, "model": {"max_seq_len": 512}}

    refused = _create(api, project, big_batch)
    bounded = _create(api, project, {**big_batch, "memory": {"micro_batch_tokens": 2048}})

    assert refused.status_code == 400, refused.json()
    fields = refused.json()["error"]["fields"]
    assert list(fields) == ["config.memory.micro_batch_tokens"]
    assert "TANDEM_TRAINER_MEMORY_BYTES" in fields["config.memory.micro_batch_tokens"][0]
    assert bounded.status_code == 201, bounded.json()
    plan = bounded.json()["memory_plan"]
    assert plan["trainer"]["micro_batch_rows"] == 4 and plan["trainer"]["micro_batches"] == 256
    assert 0 < plan["trainer"]["peak_bytes"] <= 800 * 2**20 and plan["producer"]["kv_cache_bytes"] > 0
    assert Run.objects.count() == 1


@contextlib.contextmanager
def _live_trainer_report(settings, *, platform: str):
    """A live trainer's process report, as a trainer on an accelerator of 800 MiB of ``platform`` writes it to
    Redis."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    now = time.time()
    report = ProcessReport(role="trainer", hostname=f"{platform}-host", pid=4242, started_at=now - 60,
                           reported_at=now, interval_s=600, cpu_cores=1.0, rss_bytes=2**30, host_cpu_count=8,
                           host_memory_used_bytes=2**33, host_memory_total_bytes=2**35,
                           device_memory_bytes=800 * 2**20, device_platform=platform)
    client.hset(process_reports_key(), report.field, report.model_dump_json())
    try:
        yield report
    finally:
        client.hdel(process_reports_key(), report.field)
        client.close()


@pytest.fixture
def gpu_trainer_report(settings):
    with _live_trainer_report(settings, platform="gpu") as report:
        yield report


def test_without_a_declared_limit_a_run_must_fit_the_device_a_live_trainer_reports(api, project, environment,
                                                                                    settings, gpu_trainer_report):
    settings.TANDEM_RUN_QUOTAS = RunQuotas()
    big_batch = {"rollout": {"groups_per_step": 64, "group_size": 16}, "model": {"max_seq_len": 512}}

    refused = _create(api, project, big_batch)
    bounded = _create(api, project, {**big_batch, "memory": {"micro_batch_tokens": 2048}})

    assert refused.status_code == 400, refused.json()
    message = refused.json()["error"]["fields"]["config.memory.micro_batch_tokens"][0]
    assert "0.8 GiB (the device memory that trainer gpu-host:4242 reports)" in message
    assert bounded.status_code == 201, bounded.json()

    # The operator's declared figure is the limit whatever trainers report.
    settings.TANDEM_RUN_QUOTAS = RunQuotas(trainer_memory_bytes=2**40)
    assert _create(api, project, big_batch).status_code == 201


def test_a_run_is_planned_for_the_platform_a_live_trainer_reports(api, project, environment, settings):
    """On a TPU the plan counts one logits buffer where elsewhere it counts three (tandem/configs/memory_plan.py),
    in the check of a new run and in the plan shown for it."""
    settings.TANDEM_RUN_QUOTAS = RunQuotas()
    config = {"memory": {"micro_batch_tokens": 2048}}
    planned = {}
    for platform in ("gpu", "tpu"):
        with _live_trainer_report(settings, platform=platform):
            created = _create(api, project, config)
            assert created.status_code == 201, created.json()
            shown = api.get(f"/api/runs/{created.json()['id']}/").json()["memory_plan"]["trainer"]
            planned[platform] = created.json()["memory_plan"]["trainer"]
            assert shown == planned[platform]
    assert (planned["gpu"]["logits_buffers"], planned["tpu"]["logits_buffers"]) == (3, 1)
    assert planned["tpu"]["logits_bytes"] * 3 == planned["gpu"]["logits_bytes"]
    assert planned["tpu"]["peak_bytes"] < planned["gpu"]["peak_bytes"]
