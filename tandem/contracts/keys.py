"""Redis key and stream names.

A key an object owns is ``tandem:<kind>:<id>:<what>`` (``tandem:run:7:trajectories``);
the one deployment-wide key is ``tandem:processes``.
"""

from __future__ import annotations

KEY_PREFIX = "tandem"

# Consumer group the trainer reads trajectory streams through.
TRAINER_CONSUMER_GROUP = "trainer"


def _run_key(run_id: int, suffix: str) -> str:
    return f"{KEY_PREFIX}:run:{run_id}:{suffix}"


def trajectory_stream(run_id: int) -> str:
    """Redis stream holding finished trajectories of one run."""
    return _run_key(run_id, "trajectories")


def dead_letter_stream(run_id: int) -> str:
    """Redis stream of trajectory entries the trainer could not read, with the reason."""
    return _run_key(run_id, "dead_letters")


def rollout_task_crashes_key(task_id: str) -> str:
    """Redis counter of a rollout task's deliveries that never ended: each one killed its worker."""
    return f"{KEY_PREFIX}:rollout_task:{task_id}:unfinished_deliveries"


def weights_key(run_id: int) -> str:
    """Redis hash holding the latest published policy (``version`` and ``blob``)."""
    return _run_key(run_id, "weights")


def evaluation_stream(run_id: int) -> str:
    """Redis stream of a run's evaluation episodes (EvaluationEpisode): never read for training."""
    return _run_key(run_id, "evaluations")


def evaluation_weights_key(run_id: int, version: int) -> str:
    """Redis hash holding policy ``version`` of a run for its evaluation (laid out like weights_key)."""
    return _run_key(run_id, f"evaluation_weights:{version}")


def evaluation_progress_key(run_id: int) -> str:
    """Redis hash: evaluation index -> its :class:`EvaluationProgress` JSON, kept by the trainer as episodes arrive.

    Read by the platform for progress bars; the record of an evaluation stays its report.
    """
    return _run_key(run_id, "evaluation_progress")


def run_spec_key(run_id: int) -> str:
    """Redis string holding the :class:`RunSpec` JSON that producers read."""
    return _run_key(run_id, "spec")


def run_environment_secrets_key(run_id: int) -> str:
    """Redis string holding the :class:`EnvironmentSecrets` JSON of a run's environment, for its producers.

    Under ``tandem:secrets:``, apart from the run's other keys, so that a Redis ACL can give
    secrets to the platform and workers and not to the trainer; and not one of
    :func:`run_keys`, which the trainer deletes when it starts a claimed run. The platform
    owns its life: it writes it when a trainer claims the run and deletes it when the run
    stops its producers.
    """
    return f"{KEY_PREFIX}:secrets:run:{run_id}"


def run_evaluation_secrets_key(run_id: int) -> str:
    """Redis hash: environment version id -> :class:`EnvironmentSecrets` JSON, of the other environments
    a run evaluates on (``evaluation.environments``); written and deleted with
    :func:`run_environment_secrets_key`, under ``tandem:secrets:`` for the same reason."""
    return f"{KEY_PREFIX}:secrets:run:{run_id}:evaluation"


def probe_environment_secrets_key(probe_id: int) -> str:
    """Redis string holding the :class:`EnvironmentSecrets` JSON of the version a probe loads.

    Beside :func:`probe_request_key`, with its TTL; the platform deletes it once the probe is reported.
    """
    return f"{KEY_PREFIX}:secrets:probe:{probe_id}"


def run_stop_key(run_id: int) -> str:
    """Redis string set once a run ends; producers stop starting episodes."""
    return _run_key(run_id, "stop")


def run_group_counter_key(run_id: int) -> str:
    """Redis counter of episode groups requested so far; a group's task seed."""
    return _run_key(run_id, "groups_requested")


def consumed_groups_key(run_id: int) -> str:
    """Redis sorted set of episode group ids the trainer trained on or dropped (score: unix time).

    A group in it is never trained again, even when a redelivered rollout task
    produces it anew; bounded to the newest entries by the trainer's reader.
    """
    return _run_key(run_id, "consumed_groups")


def consumed_trajectories_key(run_id: int) -> str:
    """Redis sorted set of trajectory ids the trainer trained on or dropped (score: unix time)."""
    return _run_key(run_id, "consumed_trajectories")


def producers_key(run_id: int) -> str:
    """Redis hash: producer process (``hostname:pid``) -> its latest :class:`ProducerReport` JSON."""
    return _run_key(run_id, "producers")


def demonstration_stream(run_id: int) -> str:
    """Redis stream of :class:`DemonstrationBatch`: producers' answers to the trainer's requests for SFT steps.

    One stream per run rather than a key per step, so that :func:`run_keys` names it and it
    expires with the run; the trainer deletes each answer once it has read it.
    """
    return _run_key(run_id, "demonstrations")


def producer_fault_key(run_id: int) -> str:
    """Redis string: why producers cannot serve the run at all (the first fault a producer found).

    A :class:`ProducerFault` JSON, written once (SET NX) by a producer that can never produce for
    the run as it is configured; the trainer fails the run with its reason instead of waiting.
    """
    return _run_key(run_id, "producer_fault")


def lineage_stream(run_id: int) -> str:
    """Redis stream of :class:`LineageEntry`: what became of the trajectories the trainer consumed."""
    return _run_key(run_id, "lineage")


def run_log_stream(run_id: int) -> str:
    """Redis stream of :class:`RunLogRecord`: what the run's trainer and producers logged for it.

    Bounded (``RUN_LOG_STREAM_MAX_ENTRIES``); the platform drains it into its database and
    deletes what it stored.
    """
    return _run_key(run_id, "logs")


def process_reports_key() -> str:
    """Redis hash: every Tandem process (:func:`process_report_field`) -> its latest :class:`ProcessReport` JSON.

    One hash for the whole deployment, not per run: idle processes report too.
    Readers prune fields whose report is stale (``tandem/runtime/process_reports.py``),
    so dead processes do not accumulate.
    """
    return f"{KEY_PREFIX}:processes"


def process_report_field(role: str, hostname: str, pid: int) -> str:
    """A process's field in :func:`process_reports_key`: ``role:hostname:pid``."""
    return f"{role}:{hostname}:{pid}"


def probe_request_key(probe_id: int) -> str:
    """Redis string holding the :class:`ProbeRequest` JSON a probe task reads by its id."""
    return f"{KEY_PREFIX}:probe:{probe_id}:request"


def environment_paused_key(version_id: int) -> str:
    """Redis string, set while a registered environment version is unhealthy: the reason.

    Producers start no episode of a run pinned to a paused version.
    """
    return f"{KEY_PREFIX}:environment_version:{version_id}:paused"


def environment_episode_slots_key(version_id: int) -> str:
    """Redis sorted set of the episodes holding a slot of an environment version: lease id -> expiry.

    Scored by the lease's expiry in Redis's own clock (milliseconds), so that the
    leases of a producer that died free its slots once they expire
    (``workers/episode_slots.py``). Not one of :func:`run_keys`: every run of the
    version shares its slots, on every host.
    """
    return f"{KEY_PREFIX}:environment_version:{version_id}:episode_slots"


def unregistered_environment_episode_slots_key(name: str) -> str:
    """:func:`environment_episode_slots_key` of an environment that is not from the registry (no version id)."""
    return f"{KEY_PREFIX}:environment:{name}:episode_slots"


def run_keys(run_id: int) -> tuple[str, ...]:
    """Every Redis key a run owns (Celery's own queue aside)."""
    return (
        trajectory_stream(run_id),
        dead_letter_stream(run_id),
        consumed_groups_key(run_id),
        consumed_trajectories_key(run_id),
        weights_key(run_id),
        run_spec_key(run_id),
        run_stop_key(run_id),
        run_group_counter_key(run_id),
        lineage_stream(run_id),
        producer_fault_key(run_id),
        producers_key(run_id),
        demonstration_stream(run_id),
        evaluation_stream(run_id),
        evaluation_progress_key(run_id),
        run_log_stream(run_id),
    )
