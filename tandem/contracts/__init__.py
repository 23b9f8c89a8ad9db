"""Every message, key and vocabulary that crosses a process boundary, defined once.

Producers (Celery workers), the trainer and the platform all import these
types from here; none of them builds a stream name or parses a payload by hand.
One module per topic:

- ``schema``: schema versions and the base of every versioned record;
- ``errors``: the codes of the platform API's errors, trainer-facing conflicts among them;
- ``keys``: Redis key and stream names; ``tasks``: Celery task names and queues;
- ``environments``: the table of environment kinds, the spec of a registered version and
  the reasons an episode is closed with;
- ``runs``: run statuses, the run spec producers read, the trainer's heartbeat
  and the platform's reply to it;
- ``trajectories``: finished episodes on the stream; ``trajectory_samples``:
  the ones the trainer sends for people to read;
- ``demonstrations``: an SFT step's demonstrations, made by a producer for the trainer;
- ``evaluations``: held-out evaluation requests, episodes and reports;
- ``datasets``: a row of an SFT dataset (a chat conversation), the trainer's pages of rows,
  and which environments are known to have demonstrations;
- ``stages``: the trainer's stages, in the order a step runs them;
- ``telemetry``: step events, stage timelines, episode spans, device reports, traces;
- ``probes``: environment conformance probes; ``checkpoints``: committed checkpoints;
- ``lineage``: what became of consumed trajectories; ``processes``: what producers
  and other processes say of themselves.

Each record carries ``schema_version`` so that a reader can refuse a record
written by a newer, incompatible writer instead of misreading it. A new optional
field keeps the version: old records still read. Records refuse fields they do
not know (``extra="forbid"``, so that a typo is an error, not a silent default),
so an upgrade goes readers first: the platform before its trainers and
producers, producers before the trainer that reads their stream. A change that
old readers must not take in silently bumps the record's version.
"""

from tandem.contracts.checkpoints import (
    CheckpointInfo,
    CheckpointReport,
)
from tandem.contracts.datasets import (
    DATASET_ROW_MAX_MESSAGES,
    DATASET_ROWS_PAGE_MAX,
    DEMONSTRATIONS_PROBE_CHECK,
    DatasetMessage,
    DatasetRow,
    DatasetRowError,
    DatasetRowsPage,
    DatasetToolCall,
    environment_declares_demonstrations,
    parse_dataset_line,
    probe_check_demonstrates,
    stored_row_messages,
)
from tandem.contracts.demonstrations import (
    DEMONSTRATION_ERROR_CHARS,
    DemonstrationBatch,
    DemonstrationMessage,
)
from tandem.contracts.environments import (
    ADAPTER_ENTRYPOINTS,
    ENVIRONMENT_KINDS,
    EnvironmentKind,
    EnvironmentKindDefinition,
    EnvironmentSecrets,
    EnvironmentSpec,
    EpisodeCloseReason,
    RequiredSetting,
    SecretSettingValues,
    ToolSchema,
    environment_kind_choices,
)
from tandem.contracts.errors import (
    TRAINER_HEADER,
    ErrorCode,
    TrainerConflictCode,
)
from tandem.contracts.evaluations import (
    EVALUATION_METRICS,
    EVALUATION_STATUSES,
    MAX_EVALUATION_EPISODES,
    EvaluationEpisode,
    EvaluationProgress,
    EvaluationReport,
    EvaluationRequest,
    EvaluationStatus,
    evaluation_status_choices,
)
from tandem.contracts.keys import (
    KEY_PREFIX,
    TRAINER_CONSUMER_GROUP,
    consumed_groups_key,
    consumed_trajectories_key,
    dead_letter_stream,
    demonstration_stream,
    environment_episode_slots_key,
    environment_paused_key,
    evaluation_progress_key,
    evaluation_stream,
    evaluation_weights_key,
    lineage_stream,
    probe_environment_secrets_key,
    probe_request_key,
    process_report_field,
    process_reports_key,
    producers_key,
    rollout_task_crashes_key,
    run_environment_secrets_key,
    run_group_counter_key,
    run_keys,
    run_spec_key,
    run_stop_key,
    trajectory_stream,
    unregistered_environment_episode_slots_key,
    weights_key,
)
from tandem.contracts.lineage import (
    LineageEntry,
)
from tandem.contracts.probes import (
    PROBE_ACTION,
    ProbeCheck,
    ProbePurpose,
    ProbeReport,
    ProbeRequest,
    ProbeTimeouts,
)
from tandem.contracts.processes import (
    CircuitBreakerReport,
    ProcessReport,
    ProcessRole,
    ProducerReport,
)
from tandem.contracts.runs import (
    ACTIVE_RUN_STATUSES,
    RELEASED_RUN_STATUSES,
    TERMINAL_RUN_STATUSES,
    TRAINER_HELD_RUN_STATUSES,
    RunReportedStatus,
    RunSpec,
    RunStatus,
    TrainerHeartbeat,
    TrainerHeartbeatReply,
    run_status_choices,
)
from tandem.contracts.schema import (
    SCHEMA_VERSION,
    SchemaVersionError,
)
from tandem.contracts.stages import (
    IDLE_STAGE,
    STAGE_TIMELINE_VERSION,
    TRAINER_STAGES,
    UNRECORDED_STAGE,
    TrainerStage,
    TrainerStageDefinition,
    stage_metric_name,
)
from tandem.contracts.tasks import (
    DEMONSTRATIONS_TASK_NAME,
    EVALUATION_QUEUE,
    EVALUATION_TASK_NAME,
    PLATFORM_QUEUE,
    PROBE_QUEUE,
    PROBE_REPORT_TASK_NAME,
    PROBE_TASK_NAME,
    ROLLOUT_QUEUE,
    ROLLOUT_TASK_NAME,
)
from tandem.contracts.telemetry import (
    EPISODE_SPAN_REASON_CHARS,
    DeviceReport,
    DeviceSample,
    EpisodeOutcome,
    EpisodeSpan,
    StageSpan,
    StepEpisodes,
    StepTimeline,
    TelemetryReply,
    TraceRequest,
    TrainerStepEvent,
)
from tandem.contracts.trajectories import (
    EPISODE_STATUSES,
    ConversationMessage,
    EpisodeStatus,
    EpisodeTimings,
    MessageRole,
    MessageToolCall,
    TrajectoryRecord,
    episode_status_choices,
)
from tandem.contracts.trajectory_samples import (
    SAMPLE_PURPOSES,
    SamplePurpose,
    TokenSpan,
    ToolCallSample,
    TrajectorySample,
    TrajectoryTurn,
    TurnRole,
    sample_purpose_choices,
)

__all__ = [
    "DATASET_ROW_MAX_MESSAGES",
    "DATASET_ROWS_PAGE_MAX",
    "DEMONSTRATIONS_PROBE_CHECK",
    "DatasetMessage",
    "DatasetRow",
    "DatasetRowError",
    "DatasetRowsPage",
    "DatasetToolCall",
    "environment_declares_demonstrations",
    "parse_dataset_line",
    "probe_check_demonstrates",
    "stored_row_messages",
    "SCHEMA_VERSION",
    "SchemaVersionError",
    "ErrorCode",
    "TRAINER_HEADER",
    "TrainerConflictCode",
    "KEY_PREFIX",
    "TRAINER_CONSUMER_GROUP",
    "trajectory_stream",
    "dead_letter_stream",
    "rollout_task_crashes_key",
    "weights_key",
    "run_spec_key",
    "run_stop_key",
    "run_environment_secrets_key",
    "run_group_counter_key",
    "consumed_groups_key",
    "consumed_trajectories_key",
    "producers_key",
    "lineage_stream",
    "demonstration_stream",
    "process_reports_key",
    "process_report_field",
    "probe_request_key",
    "probe_environment_secrets_key",
    "environment_paused_key",
    "environment_episode_slots_key",
    "unregistered_environment_episode_slots_key",
    "run_keys",
    "ROLLOUT_TASK_NAME",
    "ROLLOUT_QUEUE",
    "DEMONSTRATIONS_TASK_NAME",
    "PROBE_TASK_NAME",
    "PROBE_QUEUE",
    "PROBE_REPORT_TASK_NAME",
    "PLATFORM_QUEUE",
    "RequiredSetting",
    "EnvironmentKindDefinition",
    "EpisodeCloseReason",
    "ENVIRONMENT_KINDS",
    "EnvironmentKind",
    "ADAPTER_ENTRYPOINTS",
    "environment_kind_choices",
    "episode_status_choices",
    "ToolSchema",
    "EnvironmentSpec",
    "EnvironmentSecrets",
    "SecretSettingValues",
    "RunStatus",
    "TERMINAL_RUN_STATUSES",
    "TRAINER_HELD_RUN_STATUSES",
    "ACTIVE_RUN_STATUSES",
    "RELEASED_RUN_STATUSES",
    "run_status_choices",
    "RunSpec",
    "RunReportedStatus",
    "TrainerHeartbeat",
    "TrainerHeartbeatReply",
    "EPISODE_STATUSES",
    "ConversationMessage",
    "EpisodeStatus",
    "EpisodeTimings",
    "MessageRole",
    "MessageToolCall",
    "TrajectoryRecord",
    "TrainerStage",
    "TrainerStageDefinition",
    "TRAINER_STAGES",
    "IDLE_STAGE",
    "UNRECORDED_STAGE",
    "stage_metric_name",
    "STAGE_TIMELINE_VERSION",
    "StageSpan",
    "StepEpisodes",
    "StepTimeline",
    "DeviceSample",
    "EpisodeOutcome",
    "EPISODE_SPAN_REASON_CHARS",
    "EpisodeSpan",
    "DeviceReport",
    "TrainerStepEvent",
    "TraceRequest",
    "TelemetryReply",
    "ProbeTimeouts",
    "ProbePurpose",
    "PROBE_ACTION",
    "ProbeRequest",
    "ProbeCheck",
    "ProbeReport",
    "CheckpointInfo",
    "CheckpointReport",
    "LineageEntry",
    "DEMONSTRATION_ERROR_CHARS",
    "DemonstrationMessage",
    "DemonstrationBatch",
    "CircuitBreakerReport",
    "ProducerReport",
    "ProcessRole",
    "ProcessReport",
    "TurnRole",
    "TokenSpan",
    "ToolCallSample",
    "TrajectoryTurn",
    "TrajectorySample",
    "EVALUATION_METRICS",
    "EVALUATION_STATUSES",
    "EVALUATION_QUEUE",
    "EVALUATION_TASK_NAME",
    "EvaluationEpisode",
    "EvaluationProgress",
    "EvaluationReport",
    "EvaluationRequest",
    "EvaluationStatus",
    "MAX_EVALUATION_EPISODES",
    "evaluation_status_choices",
    "evaluation_progress_key",
    "evaluation_stream",
    "evaluation_weights_key",
    "SAMPLE_PURPOSES",
    "SamplePurpose",
    "sample_purpose_choices",
]
