import pytest

from tandem.contracts import METRIC_NAME_LENGTH_MAX, EpisodeTimings, TrajectoryRecord
from trainer.rollout_stats import rollout_metrics


def _record(environment, *, total, generation, status="ok"):
    return TrajectoryRecord(
        run_id=1, group_id="1-0", group_size=1, environment=environment, policy_version=0,
        token_ids=[1], behaviour_logprobs=[0.0], loss_mask=[0], reward=0.0, status=status,
        timings=EpisodeTimings(started_at=100.0, finished_at=100.0 + total, generation_s=generation,
                               environment_s=total - generation),
    )


def test_latency_percentiles_and_error_rates_are_per_environment():
    records = [_record("calc", total=t, generation=t / 4) for t in (1.0, 2.0, 3.0, 4.0)]
    records += [_record("remote", total=10.0, generation=1.0, status="failed"),
                _record("remote", total=10.0, generation=1.0),
                _record("remote", total=10.0, generation=1.0, status="truncated"),
                _record("remote", total=10.0, generation=1.0)]
    metrics = rollout_metrics(records)
    # numpy's linear interpolation: p50 of 1..4 is 2.5, p90 is 3.7 (tolerance 1e-9).
    assert metrics["rollout/calc/latency_p50_s"] == pytest.approx(2.5)
    assert metrics["rollout/calc/latency_p90_s"] == pytest.approx(3.7)
    assert metrics["rollout/calc/generation_p50_s"] == pytest.approx(0.625)
    assert metrics["rollout/calc/environment_p50_s"] == pytest.approx(1.875)
    assert metrics["rollout/calc/error_rate"] == 0.0
    assert metrics["rollout/remote/error_rate"] == 0.25
    # Truncated episodes are counted apart from failed ones, per environment.
    assert metrics["rollout/calc/truncated_rate"] == 0.0
    assert metrics["rollout/remote/truncated_rate"] == 0.25
    assert metrics["rollout/remote/latency_p99_s"] == pytest.approx(10.0)


def test_the_wait_for_an_environments_slot_has_percentiles_per_environment():
    records = [_record("capped", total=1.0, generation=0.5) for _ in range(4)]
    records = [record.model_copy(update={"timings": record.timings.model_copy(update={"slot_wait_s": wait})})
               for record, wait in zip(records, (0.0, 1.0, 2.0, 3.0), strict=True)]
    records.append(_record("free", total=1.0, generation=0.5))
    metrics = rollout_metrics(records)
    # numpy's linear interpolation over 0, 1, 2, 3: p50 1.5, p90 2.7.
    assert metrics["rollout/capped/slot_wait_p50_s"] == pytest.approx(1.5)
    assert metrics["rollout/capped/slot_wait_p90_s"] == pytest.approx(2.7)
    assert metrics["rollout/free/slot_wait_p99_s"] == 0.0
    # The wait comes before started_at: it is not part of the episode's latency.
    assert metrics["rollout/capped/latency_p99_s"] == pytest.approx(1.0)


def test_two_environments_of_long_names_sharing_their_start_get_series_of_their_own():
    """Before, the label was cut to 32 characters: both environments wrote into the same series."""
    long_name = "customer-support-desk-" + "x" * 78  # 100 characters, the registry's longest
    metrics = rollout_metrics([_record(f"{long_name}@1", total=1.0, generation=0.5, status="failed"),
                               _record(f"{long_name}@2", total=1.0, generation=0.5)])

    assert len(metrics) == 2 * 14  # 4 latencies x 3 percentiles, and 2 rates, for each environment
    assert sorted(value for name, value in metrics.items() if name.endswith("/error_rate")) == [0.0, 1.0]
    assert max(len(name) for name in metrics) <= METRIC_NAME_LENGTH_MAX
