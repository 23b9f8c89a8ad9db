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


def _tool_episode(turns, *, offered=("calc",), status="ok"):
    """An episode whose assistant turns had these tool-call outcomes: None (an answer), or (status, calls), or
    (status, calls, copies of the tool's example among them)."""
    from tandem.contracts import ConversationMessage, MessageToolCall

    messages = []
    for turn in turns:
        outcome, calls, copies = (*turn, 0)[:3] if turn is not None else (None, 0, 0)
        messages.append(ConversationMessage(
            role="assistant", content="...", start=0, end=1, tool_call_status=outcome,
            tool_calls=tuple(MessageToolCall(name="calc", copies_example=index < copies) for index in range(calls)),
            tool_call_error="" if outcome in (None, "ok") else "why"))
    record = _record("calc", total=1.0, generation=0.5, status=status)
    return record.model_copy(update={"messages": tuple(messages), "offered_tools": offered})


def test_tool_use_per_environment_counts_calls_that_ran_and_each_way_markup_made_no_call():
    records = [
        _tool_episode([("unparsed", 0), ("ok", 2), None]),          # a failed parse, two calls, the answer
        _tool_episode([("unknown_tool", 0), ("invalid_arguments", 0), None]),
        _tool_episode([None]),                                      # answered from memory
        _tool_episode([("ok", 1)], status="failed"),                # failed after its call
    ]
    metrics = rollout_metrics(records)
    assert metrics["rollout/calc/tool_call_rate"] == 0.5
    assert metrics["rollout/calc/tool_calls_per_episode"] == 0.75
    assert metrics["rollout/calc/answered_no_tools_rate"] == 0.5
    # Five turns wrote markup: one did not parse, one named an unknown tool, one had bad arguments.
    assert metrics["rollout/calc/tool_parse_failure_rate"] == 0.2
    assert metrics["rollout/calc/unknown_tool_rate"] == 0.2
    assert metrics["rollout/calc/invalid_arguments_rate"] == 0.2
    assert metrics["rollout/calc/tool_error_rate"] == 0.0
    assert metrics["rollout/calc/example_copy_rate"] == 0.0  # none of the three calls that ran


def test_the_share_of_calls_that_copied_the_tools_example_is_counted_among_calls_that_ran():
    metrics = rollout_metrics([_tool_episode([("ok", 2, 1), None]), _tool_episode([("ok", 1, 1), None]),
                               _tool_episode([("ok", 1), None])])
    assert metrics["rollout/calc/tool_calls_per_episode"] == pytest.approx(4 / 3)  # copies are calls
    assert metrics["rollout/calc/example_copy_rate"] == 0.5
    no_calls = rollout_metrics([_tool_episode([None])])
    assert "rollout/calc/example_copy_rate" not in no_calls  # no call ran: no share to speak of


def test_tool_metrics_only_where_tools_were_offered_and_failure_rates_only_where_markup_was_written():
    plain = rollout_metrics([_tool_episode([None], offered=())])
    assert not any("tool" in name for name in plain)
    unused = rollout_metrics([_tool_episode([None]), _tool_episode([None])])
    assert unused["rollout/calc/tool_call_rate"] == 0.0 and unused["rollout/calc/answered_no_tools_rate"] == 1.0
    assert "rollout/calc/tool_parse_failure_rate" not in unused  # no markup: no rate to speak of


def test_every_tool_series_of_the_longest_environment_name_fits_the_platforms_names():
    """Before, `answered_without_tools_rate` left no room for a cut label: a run on an environment of the
    registry's longest name failed at its first RL step (tests/e2e/test_long_environment_names.py)."""
    from tandem.contracts import EVALUATION_METRIC_PREFIX, metric_series_name
    from trainer.rollout_stats import tool_use_metrics

    long_name = "customer-support-desk-" + "x" * 78
    episode = _tool_episode([("unparsed", 0), ("ok", 1), None]).model_copy(update={"environment": long_name})
    metrics = rollout_metrics([episode])
    figures = tool_use_metrics([episode])
    assert len(figures) == 8 and len([name for name in metrics if name.rsplit("/", 1)[1] in figures]) == 8
    assert max(len(name) for name in metrics) <= METRIC_NAME_LENGTH_MAX
    # Evaluations name the same figures under eval/<label>/.
    for figure in figures:
        assert len(metric_series_name(EVALUATION_METRIC_PREFIX.rstrip("/"), long_name, figure)) <= METRIC_NAME_LENGTH_MAX
