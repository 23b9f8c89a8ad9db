"""Producer utilisation and circuit-breaker reports, from producer process to trainer telemetry (real Redis)."""

import time

import pytest

from tandem.contracts import EpisodeTimings, ProducerReport, producers_key
from trainer.producer_stats import ProducerStats
from workers.activity import ProducerActivity, report_activity
from workers.circuit_breaker import process_breakers


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_process_is_busy_while_any_of_its_task_threads_runs():
    clock = Clock()
    activity = ProducerActivity(clock=clock)
    activity.task_started()
    clock.now += 2
    activity.task_started()  # overlapping tasks: busy time is not counted twice
    clock.now += 3
    activity.task_finished(run_id=7, episodes=4, failed=1)
    clock.now += 1
    activity.task_finished(run_id=7, episodes=4, failed=0)
    clock.now += 4  # idle

    uptime, busy, running, episodes, failed = activity.snapshot(7)

    assert (uptime, busy, running, episodes, failed) == (10.0, 6.0, 0, 8, 1)


def test_the_runs_of_running_tasks_are_known_until_their_last_task_ends():
    activity = ProducerActivity(clock=Clock())
    activity.task_started(run_id=7)
    activity.task_started(run_id=7)
    activity.task_started(run_id=3)
    assert activity.running_run_ids() == [3, 7]
    activity.task_finished(run_id=7, episodes=2, failed=0)
    assert activity.running_run_ids() == [3, 7]  # one task of run 7 still runs
    activity.task_finished(run_id=7, episodes=2, failed=0)
    activity.task_finished(run_id=3, episodes=2, failed=0)
    assert activity.running_run_ids() == []
    assert activity.snapshot(8)[3:] == (0, 0)


def test_the_trainer_measures_each_producers_share_of_the_step(redis_client):
    run_id = 41
    clock = Clock()
    busy_worker, idle_worker = ProducerActivity(clock=clock), ProducerActivity(clock=clock)
    for activity in (busy_worker, idle_worker):
        activity.task_started()
    idle_worker.task_finished(run_id=run_id, episodes=2, failed=0)
    report_activity(redis_client, run_id, busy_worker, worker="host:1")
    report_activity(redis_client, run_id, idle_worker, worker="host:2")
    stats = ProducerStats(redis_client, run_id)
    first = stats.step_fields()
    assert first["producer_utilisation"] is None and first["producers_reporting"] == 2

    # Later, host:1 is still in its task (no new report) and host:2 stayed idle.
    time.sleep(0.4)
    second = stats.step_fields()

    assert second["producer_utilisation"] == pytest.approx(0.5, abs=0.02)
    stored = {ProducerReport.model_validate_json(raw).worker
              for raw in redis_client.hgetall(producers_key(run_id)).values()}
    assert stored == {"host:1", "host:2"}


def test_an_open_circuit_breaker_reaches_the_step_telemetry(redis_client):
    run_id = 42
    environment = "flaky-env-under-test"
    for _ in range(process_breakers.failure_threshold):
        process_breakers.record_failure(environment, "ConnectionError: refused")
    try:
        activity = ProducerActivity()
        activity.task_started()
        report = report_activity(redis_client, run_id, activity, worker="host:3")
        assert report.circuit_breakers[environment].state == "open"
        assert report.circuit_breakers[environment].last_failure_reason == "ConnectionError: refused"

        fields = ProducerStats(redis_client, run_id).step_fields()

        assert fields["circuit_breakers_open"][environment] == 1
    finally:
        process_breakers.record_success(environment)
    report_activity(redis_client, run_id, activity, worker="host:3")
    assert ProducerStats(redis_client, run_id).step_fields()["circuit_breakers_open"][environment] == 0


def _timings(started_at, *, total, generation, environment, tool):
    return EpisodeTimings(started_at=started_at, finished_at=started_at + total, generation_s=generation,
                          environment_s=environment, tool_s=tool)


def test_the_trainer_charts_where_producers_time_went_during_the_step(redis_client):
    run_id = 43
    first, second = ProducerActivity(), ProducerActivity()
    report_activity(redis_client, run_id, first, worker="host:1")
    report_activity(redis_client, run_id, second, worker="host:2")
    stats = ProducerStats(redis_client, run_id)
    assert stats.step_fields()["producer_timings"].keys() == {"rss_bytes"}  # nothing to difference yet

    first.episode_finished(run_id=run_id, timings=_timings(0.0, total=4.0, generation=2.0, environment=1.0,
                                                           tool=0.5), stream_put_s=0.5)
    second.episode_finished(run_id=run_id, timings=_timings(0.0, total=3.0, generation=3.0, environment=0.0,
                                                            tool=0.0), stream_put_s=1.0)
    second.episode_finished(run_id=run_id + 1, timings=_timings(0.0, total=9.0, generation=9.0, environment=0.0,
                                                                tool=0.0), stream_put_s=9.0)  # another run's
    time.sleep(0.05)
    for activity, worker in ((first, "host:1"), (second, "host:2")):
        report_activity(redis_client, run_id, activity, worker=worker)

    timings = stats.step_fields()["producer_timings"]

    work_s = 4.0 + 0.5 + 3.0 + 1.0
    assert timings["generation_share"] == pytest.approx(5.0 / work_s)
    assert timings["environment_share"] == pytest.approx(1.0 / work_s)
    assert timings["tool_share"] == pytest.approx(0.5 / work_s)
    assert timings["stream_put_share"] == pytest.approx(1.5 / work_s)
    assert timings["stream_put_s"] == pytest.approx(1.5)
    assert timings["cpu_cores"] >= 0.0 and timings["rss_bytes"] > 0
    # No new report since: no new work to share out, but the memory is still charted.
    assert stats.step_fields()["producer_timings"].keys() == {"rss_bytes"}


def test_each_producer_process_gets_its_own_utilisation_cpu_and_memory_figures(redis_client):
    run_id = 43
    clock = Clock(now=1000.0)
    redis_client.delete(producers_key(run_id))

    def report(worker: str, *, at: float, busy_s: float, cpu_s: float, rss_bytes: int) -> None:
        # Idle at the moment of its report (no running task), so its busy time is what it says.
        written = ProducerReport(worker=worker, reported_at=at, uptime_s=at - 900.0, busy_s=busy_s, running_tasks=0,
                                 cpu_s=cpu_s, rss_bytes=rss_bytes)
        redis_client.hset(producers_key(run_id), worker, written.model_dump_json())

    report("rollouts@gpu-host-2:311", at=1000.0, busy_s=50.0, cpu_s=80.0, rss_bytes=2**30)
    report("rollouts@gpu-host-3:7", at=1000.0, busy_s=10.0, cpu_s=5.0, rss_bytes=2**29)
    stats = ProducerStats(redis_client, run_id, clock=clock)
    assert stats.step_fields()["producer_processes"] == {
        "rollouts@gpu-host-2:311": {"rss_bytes": float(2**30)},
        "rollouts@gpu-host-3:7": {"rss_bytes": float(2**29)},
    }  # nothing to difference yet

    clock.now = 1010.0
    report("rollouts@gpu-host-2:311", at=1010.0, busy_s=58.0, cpu_s=110.0, rss_bytes=3 * 2**29)
    report("rollouts@gpu-host-3:7", at=1010.0, busy_s=11.0, cpu_s=6.0, rss_bytes=2**29)
    processes = stats.step_fields()["producer_processes"]

    # 8 of 10 s busy with 30 CPU seconds; 1 of 10 s with 1.
    assert processes["rollouts@gpu-host-2:311"] == pytest.approx(
        {"utilisation": 0.8, "cpu_cores": 3.0, "rss_bytes": 3 * 2**29})
    assert processes["rollouts@gpu-host-3:7"] == pytest.approx(
        {"utilisation": 0.1, "cpu_cores": 0.1, "rss_bytes": 2**29})
