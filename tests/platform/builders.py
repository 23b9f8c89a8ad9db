"""Payloads as other processes send them."""

from __future__ import annotations

import time

from tandem.contracts import TrainerStepEvent


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


def full_rl_step_event(run_id: int, step: int) -> TrainerStepEvent:
    """An RL step event with every series the run page charts, built with the trainer's own code.

    Two environments' episodes (one of them failing now and then) go through
    ``rollout_metrics`` and the ``StalenessRecorder``; the stages through a
    ``StageRecorder`` on a fake clock; the loss's own scalars (KL, entropy)
    and tokens/s are set as ``run_loop`` sets them.
    """
    from tests.platform.trajectory_builders import calculator_record
    from trainer.profiling import StageRecorder
    from trainer.rollout_stats import rollout_metrics
    from trainer.staleness import StalenessRecorder

    records = [calculator_record(run_id, environment="calculator") for _ in range(3)]
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
        tokens_per_s=4096 / wall_s, rollout_metrics=rollout_metrics(records),
        algorithm_metrics={"kl": 0.01 * step, "entropy": 2.0 - 0.05 * step, "clip_fraction": 0.1},
        **staleness.step_fields(), emitted_at=time.time(),
    )
