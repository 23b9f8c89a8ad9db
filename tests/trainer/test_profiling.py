"""The trainer step's stage timeline and the metric series it becomes."""

import time

import pytest

from tandem.contracts import StepTimeline, TrainerStepEvent
from trainer.profiling import StageRecorder, timeline_wall_s


class Clock:
    def __init__(self, now: float = 50.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_stages_cover_the_step_and_the_gaps_between_them_are_other():
    clock = Clock()
    recorder = StageRecorder(clock=clock, wall_clock=lambda: 1_000_000.0 + clock.now)
    recorder.start()
    clock.now += 0.5  # before the first stage: other
    with recorder.stage("data_wait"):
        clock.now += 2.0
    with recorder.stage("compute"):
        clock.now += 1.0
    clock.now += 0.25  # between stages: other
    with recorder.stage("publish"):
        clock.now += 0.125
    clock.now += 0.125  # after the last stage: other

    timeline = recorder.finish()

    assert [span.name for span in timeline.spans] == ["other", "data_wait", "compute", "other", "publish", "other"]
    assert all(a.ended_at == b.started_at for a, b in zip(timeline.spans, timeline.spans[1:], strict=False))
    assert timeline.spans[0].started_at == 1_000_050.0
    assert timeline.seconds_by_stage() == pytest.approx(
        {"other": 0.875, "data_wait": 2.0, "compute": 1.0, "publish": 0.125})
    assert timeline_wall_s(timeline) == pytest.approx(4.0)


def test_each_step_begins_where_the_last_one_ended_so_no_second_is_lost():
    clock = Clock()
    recorder = StageRecorder(clock=clock, wall_clock=lambda: clock.now)
    with recorder.stage("compute"):
        clock.now += 1.0
    first = recorder.finish()
    with recorder.stage("telemetry"):  # the first step's flush, billed to the second
        clock.now += 0.5
    with recorder.stage("compute"):
        clock.now += 1.0
    second = recorder.finish()

    assert second.spans[0].started_at == first.spans[-1].ended_at
    assert [span.name for span in second.spans] == ["telemetry", "compute"]
    assert timeline_wall_s(first) + timeline_wall_s(second) == pytest.approx(2.5)


def test_a_stage_that_raises_is_still_recorded():
    clock = Clock()
    recorder = StageRecorder(clock=clock, wall_clock=lambda: clock.now)
    with pytest.raises(RuntimeError), recorder.stage("checkpoint"):
        clock.now += 3.0
        raise RuntimeError("disk full")

    assert recorder.finish().seconds_by_stage() == {"checkpoint": 3.0}


def test_a_step_event_charts_each_stage_and_the_trainer_utilisation():
    clock = Clock()
    recorder = StageRecorder(clock=clock, wall_clock=lambda: clock.now)
    for name, seconds in (("data_wait", 1.0), ("batch", 0.5), ("host_to_device", 0.25), ("compute", 2.0),
                          ("publish", 0.25)):
        with recorder.stage(name):
            clock.now += seconds
    timeline = recorder.finish()
    event = TrainerStepEvent(run_id=1, step=3, phase="rl", policy_version=2, wall_s=4.0, wait_s=1.0,
                             compute_s=2.0, publish_s=0.25, other_s=0.75, loss=0.1, timeline=timeline,
                             emitted_at=time.time())

    values = event.metric_values()

    assert values["trainer_utilisation"] == 0.5 and values["trainer_idle_fraction"] == 0.25
    stages = {name: value for name, value in values.items() if name.startswith("stage/")}
    assert stages == pytest.approx({"stage/data_wait_s": 1.0, "stage/batch_s": 0.5,
                                    "stage/host_to_device_s": 0.25, "stage/compute_s": 2.0,
                                    "stage/publish_s": 0.25})
    assert sum(stages.values()) == pytest.approx(values["wall_s"])
    # The timeline survives the trip to the platform as JSON.
    assert TrainerStepEvent.model_validate_json(event.model_dump_json()).timeline == timeline
    assert StepTimeline.model_validate(timeline.model_dump()).version == 1


def test_tokens_per_s_is_charted_when_the_trainer_sets_it_and_absent_otherwise():
    fields = dict(run_id=1, step=3, phase="sft", policy_version=0, wall_s=2.0, wait_s=0.0, compute_s=1.5,
                  publish_s=0.0, other_s=0.5, loss=0.1, emitted_at=time.time())

    with_tokens = TrainerStepEvent(**fields, tokens_per_s=512.0)

    assert with_tokens.metric_values()["tokens_per_s"] == 512.0
    assert TrainerStepEvent.model_validate_json(with_tokens.model_dump_json()).tokens_per_s == 512.0
    assert "tokens_per_s" not in TrainerStepEvent(**fields).metric_values()


def test_the_share_of_padding_in_a_step_is_charted_from_the_batch_the_step_trained():
    from trainer.devices import DeviceMonitor
    from trainer.telemetry import profile_fields
    from trainer.train_batch import batch_tokens, pad_batch

    # 3 episodes of 5, 9 and 2 tokens in 4 rows of the 16-token bucket: 16 of 64 slots are tokens.
    batch = pad_batch([[1] * 5, [1] * 9, [1] * 2], loss_masks=[[0] * 5, [0] * 9, [0] * 2], behaviour_logprobs=None,
                      advantages=None, batch_size=4, length_buckets=(16, 32), pad_id=0)
    recorder = StageRecorder()
    with recorder.stage("compute"):
        pass
    profile = profile_fields(recorder.finish(), tokens=batch_tokens(batch), padded_tokens=batch.tokens.size,
                             length=batch.tokens.shape[1], devices=DeviceMonitor(parameters=10, interval_s=3600.0))
    event = TrainerStepEvent(run_id=1, step=1, phase="sft", policy_version=0, loss=0.1, emitted_at=time.time(),
                             **profile)

    assert profile["padding_fraction"] == pytest.approx(1 - 16 / 64)
    assert event.metric_values()["trainer/padding_fraction"] == pytest.approx(0.75)
