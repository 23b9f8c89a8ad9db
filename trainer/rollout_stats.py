"""Per-environment rollout statistics, computed from the trajectories the trainer consumes."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import numpy as np

from tandem.contracts import (
    ROLLOUT_SERIES_PREFIX,
    TOOL_CALL_RATE_FIGURE,
    TrajectoryRecord,
    metric_series_name,
)

PERCENTILES = (50, 90, 99)


def succeeded(record: TrajectoryRecord) -> bool:
    """Whether an episode counts as a success (the success rates of steps and evaluations):
    it did not fail and earned a positive reward."""
    return record.status != "failed" and record.reward > 0


def rollout_metrics(records: Iterable[TrajectoryRecord]) -> dict[str, float]:
    """Latency percentiles (total, generation, environment, slot wait), error and truncation rates per environment.

    Series are named ``rollout/<environment>/<what>`` (``metric_series_name``: cut with a hash past
    the platform's 64 characters); latencies are seconds.
    """
    by_environment: dict[str, list[TrajectoryRecord]] = defaultdict(list)
    for record in records:
        by_environment[record.environment].append(record)
    metrics: dict[str, float] = {}
    for environment, episodes in by_environment.items():
        series = {
            "latency": [r.timings.finished_at - r.timings.started_at for r in episodes],
            "generation": [r.timings.generation_s for r in episodes],
            # Tool calls are the environment's too (timed apart since EpisodeTimings.tool_s).
            "environment": [r.timings.environment_s + r.timings.tool_s for r in episodes],
            # Waiting for a slot of the environment's max_concurrent_episodes, before the episode started.
            "slot_wait": [r.timings.slot_wait_s for r in episodes],
        }
        for name, values in series.items():
            for percentile, value in zip(PERCENTILES, np.percentile(values, PERCENTILES), strict=True):
                metrics[metric_series_name(ROLLOUT_SERIES_PREFIX, environment, f"{name}_p{percentile}_s")] = float(value)
        failed = sum(r.status == "failed" for r in episodes)
        metrics[metric_series_name(ROLLOUT_SERIES_PREFIX, environment, "error_rate")] = failed / len(episodes)
        # Cut off by max_turns or max_seq_len: trained with the reward so far, so worth watching.
        truncated = sum(r.status == "truncated" for r in episodes)
        metrics[metric_series_name(ROLLOUT_SERIES_PREFIX, environment, "truncated_rate")] = truncated / len(episodes)
        if any(r.offered_tools for r in episodes):
            metrics.update({metric_series_name(ROLLOUT_SERIES_PREFIX, environment, name): value
                            for name, value in tool_use_metrics(episodes).items()})
    return metrics


#: The tool-use rates of :func:`tool_use_metrics` that are shares of episodes (the others are shares
#: of the turns that wrote tool-call markup).
EPISODE_TOOL_RATES = (TOOL_CALL_RATE_FIGURE, "answered_no_tools_rate")
EXAMPLE_COPY_RATE = "example_copy_rate"
#: The tool-use rates of :func:`tool_use_metrics` that are shares of the calls that ran.
CALL_TOOL_RATES = (EXAMPLE_COPY_RATE,)


def tool_use_metrics(episodes: list[TrajectoryRecord]) -> dict[str, float]:
    """How a policy uses the tools an environment offers, over ``episodes`` (at least one).

    ``tool_call_rate``: the share of episodes with at least one call that ran; ``tool_calls_per_episode``:
    calls that ran per episode; ``answered_no_tools_rate``: the share that ended, not failed, with
    none. Of the turns that wrote tool-call markup (only when there were some), the shares whose markup
    made no call: ``tool_parse_failure_rate`` (it did not parse), ``unknown_tool_rate`` and
    ``invalid_arguments_rate`` (the tool's schema refused them), and those whose tool refused a call
    that ran, ``tool_error_rate``. Of the calls that ran (only when some did), ``example_copy_rate``: the
    share that copied their tool's example (``MessageToolCall.copies_example``), which the tool-call bonus pays less.
    """
    calls_run = [record.tool_calls_run() for record in episodes]
    metrics = {
        TOOL_CALL_RATE_FIGURE: sum(calls > 0 for calls in calls_run) / len(episodes),
        "tool_calls_per_episode": sum(calls_run) / len(episodes),
        "answered_no_tools_rate": sum(
            calls == 0 and record.status != "failed" for calls, record in zip(calls_run, episodes, strict=True)
        ) / len(episodes),
    }
    if total_calls := sum(calls_run):
        metrics[EXAMPLE_COPY_RATE] = sum(record.example_copies_run() for record in episodes) / total_calls
    outcomes = [outcome for record in episodes for outcome in record.tool_call_outcomes()]
    if outcomes:
        for status, name in (("unparsed", "tool_parse_failure_rate"), ("unknown_tool", "unknown_tool_rate"),
                             ("invalid_arguments", "invalid_arguments_rate"), ("tool_error", "tool_error_rate")):
            metrics[name] = outcomes.count(status) / len(outcomes)
    return metrics
