"""Held-out evaluation: what the trainer asks producers for, what they stream back, what the platform stores.

The trainer asks for an evaluation of a policy version it published
(:class:`EvaluationRequest`, one Celery task per slice of the tasks). Producers
run its episodes with exactly that version, on held-out tasks
(``Environment.sample_evaluation_task``), and append each one to the run's
evaluation stream (:class:`EvaluationEpisode`), never to its trajectory
stream: nothing evaluated is ever trained on. The trainer gathers them
without waiting, and once an evaluation's episodes are in, it posts an
:class:`EvaluationReport`.
"""

from __future__ import annotations

from typing import ClassVar, Literal, get_args

from pydantic import Field

from tandem.configs.evaluation import MAX_EVALUATION_EPISODES
from tandem.contracts.schema import Record, StreamRecord
from tandem.contracts.telemetry import TOOL_CALL_RATE_FIGURE
from tandem.contracts.trajectories import TrajectoryRecord

#: complete: every episode came back; incomplete: the run ended (or its timeout passed)
#: before all of them did, and the metrics are of those that came back (``reason`` says how many).
EvaluationStatus = Literal["complete", "incomplete"]
EVALUATION_STATUSES: tuple[str, ...] = get_args(EvaluationStatus)


def evaluation_status_choices() -> list[tuple[str, str]]:
    """``(value, label)`` of every evaluation status: the platform's choices. A callable, so that
    migrations refer to it and a new status needs no migration."""
    return [(status, status.capitalize()) for status in EVALUATION_STATUSES]

#: What an evaluation is of: an environment version's held-out tasks, run as episodes by producers,
#: or a dataset version's held-out rows, scored by the trainer.
EvaluationKind = Literal["environment", "dataset"]
EVALUATION_KINDS: tuple[str, ...] = get_args(EvaluationKind)


def evaluation_kind_choices() -> list[tuple[str, str]]:
    return [(kind, kind.capitalize()) for kind in EVALUATION_KINDS]


#: What an evaluation of a dataset measures on its held-out rows: the mean negative log-likelihood
#: of their assistant tokens, its exponential, and the share of those tokens the policy ranks first.
DATASET_EVALUATION_METRICS: tuple[str, ...] = ("loss", "perplexity", "token_accuracy")

#: The share of an evaluation's episodes that succeeded, and their mean reward: its headline metrics.
EVALUATION_SUCCESS_RATE = "success_rate"
EVALUATION_MEAN_REWARD = "mean_reward"

#: What each evaluation measures, per environment (keys of EvaluationReport.metrics), besides
#: ``pass@k`` and ``avg@k`` for each k of the run's ``evaluation.pass_k``.
EVALUATION_METRICS: tuple[str, ...] = (
    EVALUATION_MEAN_REWARD, EVALUATION_SUCCESS_RATE, "mean_turns", "tool_calls_per_episode", "truncation_rate",
    "failure_rate",
)

#: The first part of the run's metric series that hold its evaluations' metrics (``eval/success_rate``,
#: ``eval/<name@version>/<metric>``, ``eval/dataset:<name@version>/<metric>``).
EVALUATION_METRIC_PREFIX = "eval/"
#: What sets a dataset's evaluation series apart from an environment's of the same name: ``dataset:``.
DATASET_SERIES_LABEL_PREFIX = "dataset:"

#: The metrics every table of evaluations shows first, in this order (then pass@k by k, then
#: EVALUATION_TOOL_METRICS and a dataset's DATASET_EVALUATION_METRICS where a row has them).
EVALUATION_LEADING_METRICS: tuple[str, ...] = (EVALUATION_SUCCESS_RATE, EVALUATION_MEAN_REWARD)

#: How the policy used the tools of an environment that offers some, as a table of evaluations shows
#: it: the share of episodes with a call that ran, calls that ran per episode, and the share of the
#: turns that wrote tool-call markup that did not parse.
EVALUATION_TOOL_METRICS: tuple[str, ...] = (
    TOOL_CALL_RATE_FIGURE, "tool_calls_per_episode", "tool_parse_failure_rate",
)
_EVALUATION_TOOL_LABELS = {TOOL_CALL_RATE_FIGURE: "Tool-call rate", "tool_calls_per_episode": "Tool calls per episode",
                           "tool_parse_failure_rate": "Tool-call parse failures"}


def evaluation_metric_label(name: str) -> str:
    """How a table of evaluations heads a metric's column: "Success rate", "Mean reward", "Tool-call rate",
    "Held-out loss" ...; any other metric (pass@k, avg@k) by its name."""
    if name in _EVALUATION_TOOL_LABELS:
        return _EVALUATION_TOOL_LABELS[name]
    if name in EVALUATION_LEADING_METRICS:
        return name.replace("_", " ").capitalize()
    if name in DATASET_EVALUATION_METRICS:
        return f"Held-out {name.replace('_', ' ')}"
    return name


class EvaluationRequest(Record):
    """One slice of an evaluation for a producer: tasks ``first_task`` .. ``first_task + tasks - 1``."""

    run_id: int
    evaluation: int = Field(ge=0, description="The evaluation's index in its run (0, 1, ...).")
    policy_version: int = Field(ge=0, description="The published version to evaluate, and no other.")
    first_task: int = Field(ge=0, description="Index of the slice's first held-out task.")
    tasks: int = Field(ge=1)
    samples_per_task: int = Field(ge=1)
    temperature: float = Field(ge=0, description="0: greedy.")
    environment: str = Field("", max_length=200, description="The label of one of the run spec's "
                             "evaluation_environments to run on; empty: the run's own environment.")


class EvaluationEpisode(StreamRecord):
    """One evaluation episode, as a producer appends it to :func:`evaluation_stream`."""

    evaluation: int = Field(ge=0)
    policy_version: int = Field(ge=0, description="The version that generated every token of it.")
    task_index: int = Field(ge=0)
    sample_index: int = Field(ge=0)
    environment: str = Field("", max_length=200, description="As its request named it; empty: the run's own.")
    record: TrajectoryRecord


class EvaluationSliceFailure(StreamRecord):
    """A slice a producer gave up on (its run never became ready, its task failed or kept killing its
    worker), appended to :func:`evaluation_stream` so that the trainer reports the evaluation at once,
    incomplete with this reason, instead of waiting for episodes that will never come."""

    evaluation: int = Field(ge=0)
    policy_version: int = Field(ge=0)
    first_task: int = Field(ge=0)
    tasks: int = Field(ge=1)
    environment: str = Field("", max_length=200, description="As its request named it; empty: the run's own.")
    reason: str = Field(max_length=2000)

    #: The stream entry field that tells this record from an :class:`EvaluationEpisode`.
    STREAM_KIND: ClassVar[str] = "slice_failure"

    def to_stream_fields(self) -> dict[str, str]:
        return {**super().to_stream_fields(), "kind": self.STREAM_KIND}


def evaluation_stream_record(fields: dict) -> EvaluationEpisode | EvaluationSliceFailure:
    """The record of an evaluation stream entry, as Redis returns it or as written."""
    kind = fields.get(b"kind", fields.get("kind"))
    if isinstance(kind, bytes):
        kind = kind.decode()
    if kind == EvaluationSliceFailure.STREAM_KIND:
        return EvaluationSliceFailure.from_stream_fields(fields)
    return EvaluationEpisode.from_stream_fields(fields)


class EvaluationProgress(Record):
    """How far one evaluation of a run has come, as its trainer saw it (``evaluation_progress_key``)."""

    evaluation: int = Field(ge=0)
    policy_version: int = Field(ge=0)
    episodes_expected: int = Field(ge=0, description="Episodes (and held-out dataset rows) it asked for.")
    episodes_received: int = Field(ge=0, description="Of them, those that came back so far.")
    status: EvaluationStatus | Literal["running"] = Field(
        "running", description="running until its report is made; then the report's status.")


class EvaluationReport(Record):
    """``POST /api/trainer/runs/<id>/evaluations/``: one evaluation of a run, posted again if retried."""

    evaluation: int = Field(ge=0)
    step: int = Field(ge=0, description="Trainer steps done when the version was published.")
    policy_version: int = Field(ge=0)
    kind: EvaluationKind = Field("environment", description="What it is of: environment or dataset.")
    environment: str = Field(description="The environment or dataset version's label, name@version.")
    status: EvaluationStatus
    reason: str = Field("", max_length=2000, description="Why it is incomplete; empty when complete.")
    tasks: int = Field(ge=0)
    samples_per_task: int = Field(ge=1)
    temperature: float = Field(ge=0)
    episodes: int = Field(ge=0, description="Episodes the metrics are of.")
    metrics: dict[str, float] = Field(description="EVALUATION_METRICS, pass@k and avg@k (an environment's; "
                                      "for one that offers tools, its tool use as the rollout/<env>/ series "
                                      "name it, tool_call_rate and the rest), or DATASET_EVALUATION_METRICS (a "
                                      "dataset's), and wall_s: seconds from the trainer's request to the last "
                                      "episode it read.")
    intervals: dict[str, tuple[float, float]] = Field(
        default_factory=dict, description="95% intervals of the metrics that have one (Wilson for rates, "
        "normal for means), over tasks.")
    trajectory_ids: list[str] = Field(default_factory=list, max_length=MAX_EVALUATION_EPISODES,
                                      description="Ids of its episodes: none of them is ever trained on.")
