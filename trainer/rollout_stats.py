"""Per-environment rollout statistics, computed from the trajectories the trainer consumes."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import numpy as np

from tandem.contracts import (
    ROLLOUT_SERIES_PREFIX,
    TrajectoryRecord,
    metric_series_name,
    tool_use_metrics,
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
