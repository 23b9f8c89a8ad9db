"""How a policy uses the tools an environment offers: the figures every process computes alike.

The trainer reports them per step (``rollout/<environment>/<figure>``) and per evaluation, the
registration probe for the imported model's baseline (``ProbeBaseline``); each from the episodes'
records, with the same 95% Wilson intervals.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tandem.contracts.telemetry import TOOL_CALL_RATE_FIGURE
from tandem.contracts.trajectories import TrajectoryRecord

#: The tool-use rates of :func:`tool_use_metrics` that are shares of episodes (the others are shares
#: of the turns that wrote tool-call markup).
EPISODE_TOOL_RATES = (TOOL_CALL_RATE_FIGURE, "answered_no_tools_rate")
EXAMPLE_COPY_RATE = "example_copy_rate"
#: The tool-use rates of :func:`tool_use_metrics` that are shares of the calls that ran.
CALL_TOOL_RATES = (EXAMPLE_COPY_RATE,)


def wilson_interval(successes: float, count: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson interval of a rate."""
    if count == 0:
        return (0.0, 1.0)
    rate = successes / count
    centre = (rate + z * z / (2 * count)) / (1 + z * z / count)
    half = z * math.sqrt(rate * (1 - rate) / count + z * z / (4 * count * count)) / (1 + z * z / count)
    return (max(0.0, centre - half), min(1.0, centre + half))


def tool_use_metrics(episodes: Sequence[TrajectoryRecord]) -> dict[str, float]:
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


def tool_use_intervals(episodes: Sequence[TrajectoryRecord], metrics: dict[str, float]
                       ) -> dict[str, tuple[float, float]]:
    """The 95% Wilson intervals of the rates among ``metrics`` (:func:`tool_use_metrics` of ``episodes``):
    the episode rates over the episodes, the copies of an example over the calls that ran, the failure
    rates over the turns that wrote tool-call markup."""
    attempts = sum(len(record.tool_call_outcomes()) for record in episodes)
    calls_run = sum(record.tool_calls_run() for record in episodes)
    intervals = {}
    for name, value in metrics.items():
        if name.endswith("_rate"):
            over = len(episodes) if name in EPISODE_TOOL_RATES else calls_run if name in CALL_TOOL_RATES else attempts
            intervals[name] = wilson_interval(round(value * over), over)
    return intervals
