"""A run's held-out evaluations, from its points to the platform: one owner beside the training loop.

At each of the run's evaluation points the loop hands over the version it just published.
:class:`RunEvaluation` asks producers for its episodes on the environments' held-out tasks
(:class:`~trainer.evaluation.Evaluations`), scores it on the datasets' held-out rows
(:class:`~trainer.dataset_evaluation.DatasetEvaluations`), sends a few episodes to the trajectory
browser, and posts the results; those the platform did not take (it was away) are posted again
after the next step. Only the run's end waits, for the evaluations still out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence

import httpx
import numpy as np
import redis
from celery import Celery

from tandem.configs.run import RunConfig
from tandem.contracts import EvaluationReport, ToolSchema
from trainer.dataset_evaluation import DatasetEvaluations
from trainer.datasets import Conversation, DatasetSource
from trainer.evaluation import Evaluations, FinishedEvaluation, evaluation_points
from trainer.platform_client import (
    ClaimedRun,
    PlatformClient,
    PlatformUnavailableError,
    is_retryable,
)
from trainer.train_batch import TrainBatch
from trainer.trajectory_samples import TrajectorySampleBuffer

logger = logging.getLogger(__name__)


class RunEvaluation:
    """Evaluates a run's policy at its points and reports what each evaluation found.

    Args:
      claimed: the run, its config's ``evaluation`` section and its evaluation environments.
      publish_kept: ``(version, key)`` publishes the current parameters again, as ``version``, in the
        hash ``key``: an evaluation's own copy, which the next steps' versions do not replace.
      load_dataset: ``(name, version)`` every row of a pinned dataset version.
      render: conversations as padded batches, and the tokens each cut (the shapes SFT compiled).
      score: :func:`~trainer.dataset_evaluation.held_out_token_statistics` of the current policy.
      trajectories: where a few of each evaluation's episodes go, as a step's do.
    """

    def __init__(self, claimed: ClaimedRun, *, platform: PlatformClient, redis_client: redis.Redis,
                 celery_app: Celery, publish_kept: Callable[[int, str], None],
                 load_dataset: Callable[[str, int], DatasetSource],
                 render: Callable[[Sequence[Conversation]], Iterator[tuple[TrainBatch, int]]],
                 score: Callable[[TrainBatch], tuple[np.ndarray, np.ndarray, np.ndarray]],
                 trajectories: TrajectorySampleBuffer):
        config: RunConfig = claimed.config
        self._run_id = claimed.run_id
        self._config = config.evaluation
        self._platform = platform
        self._trajectories = trajectories
        self._load_dataset = load_dataset
        self._render = render
        self._score = score
        # An SFT run's policy is evaluated once, at its end (RL step 0).
        rl_steps = 0 if config.algorithm.name == "sft" else config.rl_steps
        self._points = evaluation_points(rl_steps, self._config.every_steps) if self._config else []
        self._tools: dict[str, Sequence[ToolSchema]] = {
            environment.label: environment.tools for environment in claimed.evaluation_environments}
        self._episodes: Evaluations | None = None
        if self._config is not None and (self._config.environment or claimed.evaluation_environments):
            self._episodes = Evaluations(
                redis_client=redis_client, celery_app=celery_app, run_id=self._run_id, config=self._config,
                environment=claimed.environment.label, publish_kept=publish_kept,
                other_environments=[environment.label for environment in claimed.evaluation_environments])
        # Loaded at the first point that scores them.
        self._datasets: DatasetEvaluations | None = None
        self._unsent: list[EvaluationReport] = []

    @property
    def configured(self) -> bool:
        return self._config is not None

    def evaluate_if_due(self, *, rl_steps_done: int, step: int, policy_version: int) -> None:
        """Evaluate ``policy_version``, just published at ``step``, if ``rl_steps_done`` is one of the points."""
        if rl_steps_done not in self._points:
            return
        index = self._points.index(rl_steps_done)
        if self._episodes is not None:
            self._episodes.request(index=index, step=step, policy_version=policy_version)
        if self._config.datasets:
            self._post(self._held_out_datasets().evaluate(index=index, step=step, policy_version=policy_version))

    def after_step(self) -> None:
        """Post the evaluations that completed since the last step, and those the platform missed."""
        self._post(self._episodes.collect() if self._episodes is not None else [])

    def finish(self, *, between: Callable[[], None]) -> None:
        """The one wait on evaluation, before the run is reported finished: its last results, posted
        with the retries of the run's other final reports. ``between`` runs between the waits' reads."""
        finished = []
        if self._episodes is not None:
            finished = self._episodes.finish(timeout_s=self._config.timeout_s, between=between)
        if finished or self._unsent:
            self._post(finished, final=True)

    def _held_out_datasets(self) -> DatasetEvaluations:
        if self._datasets is None:
            self._datasets = DatasetEvaluations(
                datasets=[self._load_dataset(dataset.name, dataset.version) for dataset in self._config.datasets],
                rows_per_dataset=self._config.dataset_rows, render=self._render, score=self._score)
        return self._datasets

    def _post(self, finished: list[FinishedEvaluation], *, final: bool = False) -> None:
        for evaluation in filter(lambda evaluation: evaluation.records, finished):
            self._trajectories.add_step(step=evaluation.report.step, records=evaluation.records,
                                        purpose="evaluation", tools=self._tools.get(evaluation.report.environment))
        pending, self._unsent = self._unsent + [evaluation.report for evaluation in finished], []
        for report in pending:
            try:
                self._platform.post_evaluation(self._run_id, report, retries="default" if final else 0)
            except (PlatformUnavailableError, httpx.HTTPError) as exc:
                if not final and (isinstance(exc, PlatformUnavailableError) or is_retryable(exc)):
                    self._unsent.append(report)
                    continue
                logger.error("run %s: evaluation %d could not be recorded (%s): %s", self._run_id,
                             report.evaluation, exc, report.model_dump_json())
