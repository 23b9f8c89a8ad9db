"""Payloads as other processes send them."""

from __future__ import annotations

import time

from tandem.contracts import DeviceReport, TrainerStepEvent


def step_event(run_id: int, step: int, **overrides) -> dict:
    """A TrainerStepEvent as the trainer posts it (JSON), with 11 metric values."""
    event = {
        "run_id": run_id,
        "step": step,
        "phase": "rl",
        "policy_version": step,
        "wall_s": 1.0,
        "wait_s": 0.25,
        "compute_s": 0.5,
        "publish_s": 0.1,
        "other_s": 0.15,
        "loss": 1.0 / (step + 1),
        "reward_mean": 0.1 * step,
        "success_rate": 0.05 * step,
        "emitted_at": time.time(),
    }
    event.update(overrides)
    return TrainerStepEvent.model_validate(event).model_dump(mode="json")


POINTS_PER_STEP_EVENT = len(TrainerStepEvent.model_validate(step_event(1, 1)).metric_values())


def device_report(*, gpus: int = 4, **overrides) -> dict:
    """A DeviceReport as a trainer on a host of ``gpus`` H100s sends it, with a row per device."""
    rows = [
        {"id": index, "process_index": 0, "local_hardware_id": index, "platform": "gpu",
         "device_kind": "NVIDIA H100 80GB HBM3", "memory_in_use_bytes": (10 + index) * 2**30,
         "memory_peak_bytes": (20 + index) * 2**30, "memory_limit_bytes": 76 * 2**30, "duty_cycle": 0.62,
         "mfu": 0.41, "nvml_index": index, "nvml_utilisation": 0.9 - index / 10,
         "nvml_memory_used_bytes": (12 + index) * 2**30, "nvml_memory_total_bytes": 80 * 2**30}
        for index in range(gpus)
    ]
    report = {"platform": "gpu", "device_kind": "NVIDIA H100 80GB HBM3", "device_count": gpus,
              "local_device_count": gpus, "memory_in_use_bytes": sum(r["memory_in_use_bytes"] for r in rows),
              "duty_cycle": 0.62, "mfu": 0.41, "peak_flops_per_device": 989e12, "host_cpu_percent": 37.0,
              "host_memory_used_bytes": 100 * 2**30, "host_memory_total_bytes": 2000 * 2**30,
              "process_cpu_cores": 1.5, "process_rss_bytes": 6 * 2**30, "hostname": "gpu-host-1",
              "process_id": 4242, "process_index": 0, "devices": rows, "reported_at": time.time()}
    report.update(overrides)
    return report


STAGES = (("data_wait", 0.3), ("batch", 0.05), ("host_to_device", 0.02), ("compute", 0.5),
          ("publish", 0.08), ("telemetry", 0.05))


def episode_span(group: str, index: int, *, started_at: float, seconds: float = 1.0, outcome="trained",
                 status="ok", policy_version: int = 0, **overrides) -> dict:
    """An EpisodeSpan as the trainer posts it: 60% generation, 20% environment, 10% tool calls."""
    span = {
        "trajectory_id": f"{group}-{index}", "group_id": group, "environment": "calculator",
        "status": status, "failure_reason": "tool calc timed out" if status == "failed" else "",
        "started_at": started_at, "finished_at": started_at + seconds,
        "generation_s": 0.6 * seconds, "environment_s": 0.2 * seconds, "tool_s": 0.1 * seconds,
        "policy_version": policy_version, "newest_policy_version": policy_version,
        "reward": 1.0 if index % 2 else 0.0, "outcome": "failed" if status == "failed" else outcome,
    }
    span.update(overrides)
    return span


def timeline_event(run_id: int, step: int, *, started_at: float, stages=STAGES, episodes=(),
                   **overrides) -> dict:
    """A step event with a contiguous stage timeline from ``started_at`` and the episodes it consumed."""
    spans, cursor = [], started_at
    for name, seconds in stages:
        spans.append({"name": name, "started_at": cursor, "ended_at": cursor + seconds})
        cursor += seconds
    seconds_by = {name: seconds for name, seconds in stages}
    wall = cursor - started_at
    wait, compute, publish = (seconds_by.get(name, 0.0) for name in ("data_wait", "compute", "publish"))
    return step_event(
        run_id, step, wall_s=wall, wait_s=wait, compute_s=compute, publish_s=publish,
        other_s=wall - wait - compute - publish, timeline={"spans": spans}, episodes=list(episodes),
        **overrides,
    )


def full_rl_step_event(run_id: int, step: int) -> TrainerStepEvent:
    """An RL step event with every series the run page charts, built with the trainer's own code.

    Two environments' episodes (one of them failing now and then) go through
    ``rollout_metrics`` and the ``StalenessRecorder``; the stages through a
    ``StageRecorder`` on a fake clock; the loss's own scalars (KL, entropy)
    and tokens/s are set as ``trainer.telemetry.profile_fields`` sets them.
    """
    from tests.platform.trajectory_builders import calculator_record, tool_use_record
    from trainer.idle_attribution import IdleAttribution
    from trainer.profiling import StageRecorder
    from trainer.rollout_stats import rollout_metrics
    from trainer.staleness import StalenessRecorder

    # The calculator offers its tool: two of its episodes call it, one writes a call that does not parse.
    records = [tool_use_record(run_id, first_turn=first_turn).model_copy(update={"offered_tools": ("calc",)})
               for first_turn in ("ok", "ok", "unparsed")]
    records += [calculator_record(run_id, environment="echo-http", status="failed" if step % 2 else "ok")]
    # Episodes of different ages and lengths, so histograms and percentiles have some spread.
    records = [
        record.model_copy(update={
            "policy_version": 3 - index % 2, "policy_versions": [3 - index % 2, 4],
            "timings": record.timings.model_copy(update={
                "finished_at": 101.0 + 0.4 * index + 0.1 * (step % 5), "generation_s": 0.6 + 0.1 * index}),
        })
        for index, record in enumerate(records)
    ]
    # The step's 0.2 s wait ended with its last episode: the attribution the feed makes of it.
    idle = IdleAttribution()
    last = max(record.timings.finished_at for record in records)
    idle.waited(waited_from=last - 0.2, waited_until=last, records=records, requested_at={})
    staleness = StalenessRecorder()
    # policy_version 3..4 in the records: staleness grows with the step, so buckets come and go.
    staleness.trained(records, policy_version=4 + step % 3)

    now = [1000.0 * step]
    stages = StageRecorder(clock=lambda: now[0], wall_clock=lambda: now[0])
    for name, seconds in (("data_wait", 0.2), ("batch", 0.05), ("host_to_device", 0.05), ("compute", 0.5),
                          ("publish", 0.1), ("checkpoint", 0.02), ("telemetry", 0.08)):
        with stages.stage(name):
            now[0] += seconds
    timeline = stages.finish()
    seconds = timeline.seconds_by_stage()
    wall_s = sum(seconds.values())
    return TrainerStepEvent(
        run_id=run_id, step=step, phase="rl", policy_version=step, wall_s=wall_s,
        wait_s=seconds["data_wait"], compute_s=seconds["compute"], publish_s=seconds["publish"],
        other_s=wall_s - seconds["data_wait"] - seconds["compute"] - seconds["publish"], timeline=timeline,
        loss=1.0 / (step + 1), reward_mean=0.1 * step, success_rate=0.75,
        samples_per_s=len(records) / wall_s, samples_produced_per_s=1.2 * len(records) / wall_s,
        tokens_per_s=4096 / wall_s, padding_fraction=0.125, rollout_metrics=rollout_metrics(records), idle_seconds=idle.take(),
        algorithm_metrics={"kl": 0.01 * step, "entropy": 2.0 - 0.05 * step, "clip_fraction": 0.1},
        **staleness.step_fields(), emitted_at=time.time(),
        device=DeviceReport.model_validate(device_report()),
        producer_timings={"cpu_cores": 3.5, "rss_bytes": 3.0 * 2**30},
        producer_processes={"rollouts-1@gpu-host-2:311": {"utilisation": 0.8, "cpu_cores": 3.5,
                                                          "rss_bytes": 3.0 * 2**30}},
    )
