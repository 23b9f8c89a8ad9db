"""Held-out evaluation during training: asked for beside training, gathered without waiting.

At each evaluation point (before the first RL step, every
``evaluation.every_steps`` RL steps, and at the end) the trainer keeps the
version it just published in a hash of its own, and sends producers the
evaluation's tasks in slices (``EvaluationRequest``). Their episodes come back
on the run's evaluation stream, which the rollout feed never reads, so nothing
evaluated is ever trained on. :meth:`Evaluations.collect` reads what arrived
between steps and returns the evaluations that are complete; only the run's
end waits for the ones still out, up to ``evaluation.timeout_s``.

No JAX here but what publishing the kept version needs (the publisher's).
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import redis
from celery import Celery

from tandem.configs.evaluation import EvaluationConfig
from tandem.contracts import (
    EVALUATION_MEAN_REWARD,
    EVALUATION_QUEUE,
    EVALUATION_SUCCESS_RATE,
    EVALUATION_TASK_NAME,
    EvaluationEpisode,
    EvaluationProgress,
    EvaluationReport,
    EvaluationRequest,
    EvaluationSliceFailure,
    TrajectoryRecord,
    evaluation_progress_key,
    evaluation_stream,
    evaluation_stream_record,
    evaluation_weights_key,
    tool_use_intervals,
    tool_use_metrics,
    wilson_interval,
)
from trainer.rollout_stats import succeeded

logger = logging.getLogger(__name__)

# A kept version outlives the evaluation's slowest slice; it expires if the trainer dies.
_KEPT_VERSION_TTL_S = 3 * 3600


def pass_at_k(samples: int, successes: int, k: int) -> float:
    """The unbiased estimate of pass@k from ``samples`` tries of a task with ``successes`` among them.

    1 - C(n - c, k) / C(n, k) (Chen et al., 2021): the chance that k tries drawn without
    replacement from the n include a success.
    """
    if not 0 <= successes <= samples or not 1 <= k <= samples:
        raise ValueError(f"need 0 <= successes <= samples and 1 <= k <= samples, got {successes}, {samples}, {k}")
    if samples - successes < k:
        return 1.0
    return 1.0 - math.comb(samples - successes, k) / math.comb(samples, k)


def mean_interval(values: Sequence[float], z: float = 1.96, *, bounds: tuple[float, float] | None = None
                  ) -> tuple[float, float]:
    """95% normal interval of a mean, cut to ``bounds`` (what a mean of such values can be) where given."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return (mean, mean)
    half = z * statistics.stdev(values) / math.sqrt(len(values))
    low, high = bounds if bounds is not None else (-math.inf, math.inf)
    return (max(mean - half, low), min(mean + half, high))


def _reward_bounds(rewards: Sequence[float]) -> tuple[float, float]:
    """What a mean reward can be: environments declare no reward range, so the episodes' own range. The
    normal interval of a few rewards of 0 or 1 reached past 1 ([0.708, 1.042] for 0.875 over 8 episodes);
    a resampled (bootstrap) interval keeps within the rewards' range as this does."""
    return (min(rewards), max(rewards))


def evaluation_metrics(episodes: Sequence[EvaluationEpisode], *, pass_k: Sequence[int]
                       ) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """The metrics of an evaluation's episodes, and the 95% intervals of those that have one.

    pass@k and avg@k are per task, then averaged over tasks; only tasks with at
    least k samples count for pass@k. The intervals of per-task quantities
    (pass@k) are over tasks, those of rates over episodes.
    """
    if not episodes:
        return {}, {}
    by_task: dict[int, list[TrajectoryRecord]] = {}
    for episode in episodes:
        by_task.setdefault(episode.task_index, []).append(episode.record)
    records = [episode.record for episode in episodes]
    successes = sum(succeeded(record) for record in records)
    count = len(records)
    rewards = [record.reward for record in records]
    metrics = {
        EVALUATION_MEAN_REWARD: statistics.fmean(rewards),
        EVALUATION_SUCCESS_RATE: successes / count,
        "mean_turns": statistics.fmean(record.num_turns for record in records),
        "tool_calls_per_episode": statistics.fmean(record.tool_calls_run() for record in records),
        "truncation_rate": sum(record.status == "truncated" for record in records) / count,
        "failure_rate": sum(record.status == "failed" for record in records) / count,
    }
    intervals = {EVALUATION_SUCCESS_RATE: wilson_interval(successes, count),
                 EVALUATION_MEAN_REWARD: mean_interval(rewards, bounds=_reward_bounds(rewards))}
    if any(record.offered_tools for record in records):
        # As the training steps report them (rollout/<env>/...), with Wilson intervals.
        tools = tool_use_metrics(records)
        metrics.update(tools)
        intervals.update(tool_use_intervals(records, tools))
    per_task_success = [sum(map(succeeded, task)) / len(task) for task in by_task.values()]
    for k in pass_k:
        per_task = [pass_at_k(len(task), sum(map(succeeded, task)), k) for task in by_task.values() if len(task) >= k]
        if per_task:
            metrics[f"pass@{k}"] = statistics.fmean(per_task)
            intervals[f"pass@{k}"] = mean_interval(per_task, bounds=(0.0, 1.0))
        # avg@k: the mean success of k tries, whose unbiased estimate from n >= k tries is c / n.
        metrics[f"avg@{k}"] = statistics.fmean(per_task_success)
    return metrics, intervals


def evaluation_points(rl_steps: int, every_steps: int) -> list[int]:
    """RL steps done at which the run evaluates: 0, every ``every_steps``, and its last."""
    points = list(range(0, rl_steps + 1, every_steps))
    if points[-1] != rl_steps:
        points.append(rl_steps)
    return points


@dataclass(frozen=True)
class FinishedEvaluation:
    """An evaluation's report, and the episodes it is of (for the trajectory browser)."""

    report: EvaluationReport
    records: list[TrajectoryRecord]


@dataclass
class _Pending:
    request: EvaluationRequest
    step: int
    requested_at: float = field(default_factory=time.monotonic)
    episodes: dict[tuple[int, int], EvaluationEpisode] = field(default_factory=dict)
    entry_ids: list[str] = field(default_factory=list)
    # Slices producers gave up on: their (task, sample) keys, and why.
    lost: set[tuple[int, int]] = field(default_factory=set)
    failures: list[EvaluationSliceFailure] = field(default_factory=list)

    @property
    def expected(self) -> int:
        return self.request.tasks * self.request.samples_per_task

    @property
    def accounted_for(self) -> int:
        """Episodes that came back, and those of given-up slices that did not."""
        return len(self.episodes) + len(self.lost - self.episodes.keys())

    @property
    def target(self) -> tuple[int, str]:
        return (self.request.evaluation, self.request.environment)


class Evaluations:
    """A run's evaluations: asked for at their points, gathered as their episodes arrive.

    ``publish_kept(version, key)`` writes the published parameters of ``version``
    to the hash ``key`` (the trainer's publisher, pointed there).
    """

    def __init__(self, *, redis_client: redis.Redis, celery_app: Celery, run_id: int, config: EvaluationConfig,
                 environment: str, publish_kept: Callable[[int, str], None],
                 other_environments: Sequence[str] = ()):
        """``environment``: the run's own environment's label, evaluated if ``config.environment``;
        ``other_environments``: the labels of the others it evaluates on (the run spec's)."""
        self._redis = redis_client
        self._celery = celery_app
        self._run_id = run_id
        self._config = config
        self._environment = environment
        # What each point evaluates, as requests name them: "" is the run's own environment.
        self._targets = ([""] if config.environment else []) + list(other_environments)
        self._publish_kept = publish_kept
        self._pending: dict[tuple[int, str], _Pending] = {}
        # Per evaluation index, per target: (episodes expected, received, status), for progress bars.
        self._progress: dict[int, dict[str, tuple[int, int, str]]] = {}
        self._versions: dict[int, int] = {}  # the policy version of each evaluation index asked for
        # Episodes are read from the newest entry when this trainer started: an earlier
        # trainer's evaluations are asked for again at their points, not finished from its leftovers.
        self._last_id = "$"

    def request(self, *, index: int, step: int, policy_version: int) -> None:
        """Evaluate ``policy_version`` (just published) as the run's evaluation ``index``, on every target."""
        if self._last_id == "$":
            newest = self._redis.xrevrange(evaluation_stream(self._run_id), count=1)
            self._last_id = newest[0][0].decode() if newest else "0-0"
        key = evaluation_weights_key(self._run_id, policy_version)
        self._publish_kept(policy_version, key)
        self._redis.expire(key, _KEPT_VERSION_TTL_S)
        config = self._config
        self._versions[index] = policy_version
        for target in self._targets:
            request = EvaluationRequest(run_id=self._run_id, evaluation=index, policy_version=policy_version,
                                        first_task=0, tasks=config.tasks, samples_per_task=config.samples_per_task,
                                        temperature=config.temperature, environment=target)
            pending = self._pending[(index, target)] = _Pending(request=request, step=step)
            self._track(pending)
            for first in range(0, config.tasks, config.tasks_per_request):
                part = request.model_copy(update={"first_task": first,
                                                  "tasks": min(config.tasks_per_request, config.tasks - first)})
                self._celery.send_task(EVALUATION_TASK_NAME, kwargs={"request": part.model_dump_json()},
                                       queue=EVALUATION_QUEUE)
            logger.info("run %s: evaluation %d of version %d on %s asked for (%d episodes)", self._run_id, index,
                        policy_version, self._label(target), pending.expected)
        self._record_progress(index)

    @property
    def outstanding(self) -> int:
        return len(self._pending)

    def collect(self, *, block_ms: int | None = None) -> list[FinishedEvaluation]:
        """Read what arrived; the reports of evaluations now complete (each returned once)."""
        if not self._pending:
            return []
        replies = self._redis.xread({evaluation_stream(self._run_id): self._last_id}, count=10_000,
                                    block=block_ms)
        advanced: set[tuple[int, str]] = set()
        for _, entries in replies or []:
            for entry_id, fields in entries:
                self._last_id = entry_id.decode()
                entry = evaluation_stream_record(fields)
                pending = self._pending.get((entry.evaluation, entry.environment))
                if pending is None or entry.policy_version != pending.request.policy_version:
                    continue  # an evaluation of an earlier trainer of the run
                pending.entry_ids.append(self._last_id)
                advanced.add(pending.target)
                if isinstance(entry, EvaluationSliceFailure):
                    pending.failures.append(entry)
                    pending.lost.update((task, sample) for task in range(entry.first_task, entry.first_task + entry.tasks)
                                        for sample in range(pending.request.samples_per_task))
                else:
                    pending.episodes[(entry.task_index, entry.sample_index)] = entry
        for target in advanced:
            self._track(self._pending[target])
        done = [target for target, pending in self._pending.items() if pending.accounted_for >= pending.expected]
        finished = [self._finish(self._pending.pop(target)) for target in done]
        for index in {index for index, _ in advanced}:
            self._record_progress(index)
        return finished

    def _finish(self, pending: _Pending) -> FinishedEvaluation:
        """The report of an evaluation whose every episode came back or was given up on."""
        missing = pending.expected - len(pending.episodes)
        if not missing:
            return self._report(pending, status="complete")
        reasons = "; ".join(f"tasks {failure.first_task}..{failure.first_task + failure.tasks - 1}: {failure.reason}"
                            for failure in pending.failures)
        return self._report(pending, status="incomplete",
                            reason=f"{missing} of {pending.expected} episodes were given up on by producers "
                                   f"({reasons})"[:2000])

    def finish(self, *, timeout_s: float, between: Callable[[], None] = lambda: None) -> list[FinishedEvaluation]:
        """Wait up to ``timeout_s`` for the evaluations still out; the rest are reported incomplete."""
        reports = []
        deadline = time.monotonic() + timeout_s
        while self._pending and time.monotonic() < deadline:
            reports += self.collect(block_ms=500)
            between()
        for target in list(self._pending):
            pending = self._pending.pop(target)
            reason = (f"{len(pending.episodes)} of {pending.expected} episodes came back within "
                      f"evaluation.timeout_s ({timeout_s:g}s) of the run's end")
            reports.append(self._report(pending, status="incomplete", reason=reason))
            self._record_progress(pending.request.evaluation)
        return reports

    def _label(self, target: str) -> str:
        return target or self._environment

    def _track(self, pending: _Pending, status: str = "running") -> None:
        self._progress.setdefault(pending.request.evaluation, {})[pending.request.environment] = (
            pending.expected, len(pending.episodes), status)

    def _record_progress(self, index: int) -> None:
        """Evaluation ``index``'s progress over all its targets, for progress bars (the platform reads it);
        a failed write never stops training."""
        targets = self._progress.get(index, {}).values()
        statuses = {status for _, _, status in targets}
        status = "running" if "running" in statuses else "incomplete" if "incomplete" in statuses else "complete"
        progress = EvaluationProgress(
            evaluation=index, policy_version=self._versions[index],
            episodes_expected=sum(expected for expected, _, _ in targets),
            episodes_received=sum(received for _, received, _ in targets), status=status)
        try:
            key = evaluation_progress_key(self._run_id)
            self._redis.hset(key, str(index), progress.model_dump_json())
            self._redis.expire(key, _KEPT_VERSION_TTL_S)
        except redis.RedisError:
            logger.warning("run %s: evaluation %d's progress not recorded", self._run_id, index, exc_info=True)

    def _report(self, pending: _Pending, *, status: str, reason: str = "") -> FinishedEvaluation:
        episodes = sorted(pending.episodes.values(), key=lambda e: (e.task_index, e.sample_index))
        metrics, intervals = evaluation_metrics(episodes, pass_k=self._config.pass_k)
        # What the evaluation cost: seconds from the request to its last episode read here.
        metrics["wall_s"] = time.monotonic() - pending.requested_at
        request = pending.request
        if pending.entry_ids:
            self._redis.xdel(evaluation_stream(self._run_id), *pending.entry_ids)
        if not any(other.request.policy_version == request.policy_version for other in self._pending.values()):
            self._redis.delete(evaluation_weights_key(self._run_id, request.policy_version))
        self._track(pending, status)
        label = self._label(request.environment)
        logger.info("run %s: evaluation %d on %s %s: %s", self._run_id, request.evaluation, label, status,
                    {name: round(value, 3) for name, value in metrics.items()})
        report = EvaluationReport(
            evaluation=request.evaluation, step=pending.step, policy_version=request.policy_version,
            environment=label, status=status, reason=reason, tasks=request.tasks,
            samples_per_task=request.samples_per_task, temperature=request.temperature,
            episodes=len(episodes), metrics=metrics, intervals=intervals,
            trajectory_ids=[episode.record.trajectory_id for episode in episodes],
        )
        return FinishedEvaluation(report=report, records=[episode.record for episode in episodes])
