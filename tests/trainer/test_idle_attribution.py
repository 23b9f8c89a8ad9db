"""The trainer's waits for data, attributed to the environment and cause on their critical path:
by hand, and through the rollout feed on a real Redis with a slow and a fast environment."""

from __future__ import annotations

import pytest

from tandem.configs.rollout import RolloutConfig
from tandem.configs.run import RunConfig
from tandem.contracts import (
    IDLE_CAUSES,
    EpisodeTimings,
    TrainerStepEvent,
    TrajectoryRecord,
    trajectory_stream,
)
from trainer.idle_attribution import IdleAttribution, wait_attribution
from trainer.rollout_feed import RolloutFeed


def _record(run_id: int, group: int, *, environment: str, started: float, finished: float,
            generation: float = 0.0, environment_s: float = 0.0, tool: float = 0.0) -> TrajectoryRecord:
    return TrajectoryRecord(
        run_id=run_id, group_id=f"{run_id}-{group}", group_size=2, environment=environment, policy_version=0,
        policy_versions=[0], token_ids=[1, 2, 3], behaviour_logprobs=[0.0, -0.5, -0.7], loss_mask=[0, 1, 1],
        reward=1.0, timings=EpisodeTimings(started_at=started, finished_at=finished, generation_s=generation,
                                           environment_s=environment_s, tool_s=tool))


def test_a_wait_is_cut_where_the_critical_episodes_phases_begin_and_end():
    # Waited 100 -> 112; the group was asked for at 101, its episode ran 103 -> 111 (2 s generating,
    # 4 s in environment steps, 2 s in tool calls) and was read at 112.
    critical = _record(1, 0, environment="shout", started=103, finished=111, generation=2, environment_s=4, tool=2)
    seconds = wait_attribution(waited_from=100, waited_until=112, critical=critical, requested_at=101)
    assert seconds == pytest.approx({"queue": 1 + 1, "capacity": 2, "generation": 2, "environment": 4, "tool": 2})
    assert set(seconds) <= set(IDLE_CAUSES)
    # The wait began mid-episode: only the overlap counts, split in the episode's shares.
    seconds = wait_attribution(waited_from=107, waited_until=111, critical=critical, requested_at=101)
    assert seconds == pytest.approx({"generation": 1, "environment": 2, "tool": 1})
    # A group an earlier trainer requested: from the wait's start to the episode's, producers were busy.
    assert wait_attribution(waited_from=100, waited_until=111, critical=critical, requested_at=None) == (
        pytest.approx({"capacity": 3, "generation": 2, "environment": 4, "tool": 2}))
    # Everything had arrived before the wait: it was all reading and assembling.
    assert wait_attribution(waited_from=120, waited_until=120.5, critical=critical, requested_at=101) == (
        pytest.approx({"queue": 0.5}))


def test_the_steps_attribution_becomes_its_idle_series():
    attribution = IdleAttribution()
    records = [_record(1, 0, environment="fast", started=100, finished=101, generation=1),
               _record(1, 1, environment="slow", started=100, finished=104, environment_s=4)]
    attribution.waited(waited_from=100, waited_until=104, records=records, requested_at={"1-1": 100})
    idle = attribution.take()
    assert idle == {"slow": {"environment": pytest.approx(4.0)}} and attribution.take() == {}
    event = TrainerStepEvent(run_id=1, step=3, phase="rl", policy_version=2, wall_s=5, wait_s=4, compute_s=1,
                             publish_s=0, other_s=0, loss=0.1, idle_seconds=idle, emitted_at=0)
    assert event.metric_values()["idle/slow/environment_s"] == pytest.approx(4.0)


class _WallClock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


class _RecordingCelery:
    def __init__(self):
        self.sent = []

    def send_task(self, name, *, args, queue):
        self.sent.append(args)


def test_a_run_with_a_slow_and_a_fast_environment_waits_on_the_slow_ones_steps(redis_client, run_id):
    clock = _WallClock(1000.0)
    feed = RolloutFeed(redis_client=redis_client, celery_app=_RecordingCelery(), run_id=run_id,
                       config=RunConfig(rollout=RolloutConfig(groups_per_step=2, group_size=2, groups_per_task=1,
                                                              backlog_steps=1)),
                       consumer="trainer-a", rl_steps_left=4, block_ms=10, wall_clock=clock)
    stream = trajectory_stream(run_id)

    def arrive(group: int, **timings):
        for _ in range(2):  # the group's two episodes, alike but for their ids
            redis_client.xadd(stream, _record(run_id, group, **timings).to_stream_fields())

    def step_one_arrives():
        # Group 0 ("fast": 1 s of generation) is in at 1001; group 1 ("slow": 0.5 s of generation and
        # 5.5 s of environment steps) started at 1002, when a producer was free, and ends at 1008.
        if not redis_client.xlen(stream):
            arrive(0, environment="fast", started=1000, finished=1001, generation=1)
            arrive(1, environment="slow", started=1002, finished=1008, generation=0.5, environment_s=5.5)
            clock.now = 1008.25  # read and assembled a quarter second after its end

    feed.next_step(after_step=0, policy_version=0, between_reads=step_one_arrives)
    first = feed.step_fields(wall_s=9.0)["idle_seconds"]

    assert first == {"slow": pytest.approx({"capacity": 2.0, "generation": 0.5, "environment": 5.5, "queue": 0.25})}
    assert sum(first["slow"].values()) == pytest.approx(8.25)  # the whole wait, 1000 -> 1008.25

    # The next step waits from 1009; this time the slow environment's group is in early and the fast
    # one's episode, which started at 1009.5 when a producer was free, generates for 3 s.
    clock.now = 1009.0

    def step_two_arrives():
        if redis_client.xlen(stream) == 4:
            arrive(2, environment="slow", started=1003, finished=1005, environment_s=2)
            arrive(3, environment="fast", started=1009.5, finished=1012.5, generation=3)
            clock.now = 1012.5

    feed.next_step(after_step=1, policy_version=1, between_reads=step_two_arrives)
    second = feed.step_fields(wall_s=4.0)["idle_seconds"]

    assert second == {"fast": pytest.approx({"capacity": 0.5, "generation": 3.0})}
