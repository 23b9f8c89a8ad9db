"""Every message and key that crosses a process boundary, defined once.

Producers (Celery workers), the trainer and the platform all import these
types; none of them builds a stream name or parses a payload by hand. Each
record carries ``schema_version`` so that a reader can refuse a record written
by a newer, incompatible writer instead of misreading it.

A new optional field keeps the version: old records still read. Records refuse
fields they do not know (``extra="forbid"``, so that a typo is an error, not a
silent default), so an upgrade goes readers first: the platform before its
trainers and producers, producers before the trainer that reads their stream.
A change that old readers must not take in silently bumps the record's version.
"""

from __future__ import annotations

import uuid
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

SCHEMA_VERSION = 1

KEY_PREFIX = "tandem"

# Celery routing for rollout production. The trainer sends by name, so it
# never imports the worker code (and never drags JAX init order into Celery).
ROLLOUT_TASK_NAME = "tandem.rollouts.produce"
ROLLOUT_QUEUE = "rollouts"

# Consumer group the trainer reads trajectory streams through.
TRAINER_CONSUMER_GROUP = "trainer"

# Conformance probes of registered environments run where environments run (the
# rollout workers, `tandem worker` consumes both queues); their reports go back
# to the platform's own Celery worker, which has the database. Workers keep
# needing nothing but Redis.
PROBE_TASK_NAME = "tandem.environments.probe"
PROBE_QUEUE = "probes"
PROBE_REPORT_TASK_NAME = "tandem.environments.record_probe_report"
PLATFORM_QUEUE = "platform"


class SchemaVersionError(ValueError):
    """A record was written with a schema this reader does not understand."""


def _run_key(run_id: int, suffix: str) -> str:
    return f"{KEY_PREFIX}:run:{run_id}:{suffix}"


def trajectory_stream(run_id: int) -> str:
    """Redis stream holding finished trajectories of one run."""
    return _run_key(run_id, "trajectories")


def dead_letter_stream(run_id: int) -> str:
    """Redis stream of trajectory entries the trainer could not read, with the reason."""
    return _run_key(run_id, "dead_letters")


def weights_key(run_id: int) -> str:
    """Redis hash holding the latest published policy (``version`` and ``blob``)."""
    return _run_key(run_id, "weights")


def run_spec_key(run_id: int) -> str:
    """Redis string holding the :class:`RunSpec` JSON that producers read."""
    return _run_key(run_id, "spec")


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


def lineage_stream(run_id: int) -> str:
    """Redis stream of :class:`LineageEntry`: what became of the trajectories the trainer consumed."""
    return _run_key(run_id, "lineage")


def process_reports_key() -> str:
    """Redis hash: every Tandem process (:func:`process_report_field`) -> its latest :class:`ProcessReport` JSON.

    One hash for the whole deployment, not per run: idle processes report too.
    Readers prune fields whose report is stale (``tandem/process_reports.py``),
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
        producers_key(run_id),
    )


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: int = SCHEMA_VERSION
    # Versions this reader understands. A record whose shape changed lists its
    # older versions too and upgrades them in a validator of its own.
    readable_schema_versions: ClassVar[frozenset[int]] = frozenset({SCHEMA_VERSION})

    @model_validator(mode="before")
    @classmethod
    def _refuse_unknown_schema(cls, data):
        if isinstance(data, dict):
            version = data.get("schema_version", cls.model_fields["schema_version"].default)
            if version not in cls.readable_schema_versions:
                raise SchemaVersionError(
                    f"{cls.__name__} schema_version {version} is not supported "
                    f"(this reader understands {sorted(cls.readable_schema_versions)})"
                )
        return data


EnvironmentKind = Literal["python", "http", "openenv", "gymnasium", "reasoning_gym"]

# The class producers load for each kind that is an adapter; a 'python'
# registration names its own class.
ADAPTER_ENTRYPOINTS: dict[str, str] = {
    "http": "environments.adapters.http:RemoteHTTPEnvironment",
    "openenv": "environments.adapters.openenv:OpenEnvEnvironment",
    "gymnasium": "environments.adapters.gymnasium_text:GymnasiumTextEnvironment",
    "reasoning_gym": "environments.adapters.reasoning_gym:ReasoningGymEnvironment",
}


class ToolSchema(BaseModel):
    """A tool an environment declares: its name and the JSON schema of its arguments."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    parameters: dict = Field(description="JSON schema of the arguments (an object schema).")


class EnvironmentSpec(_Record):
    """One immutable version of a registered environment, as producers and probes need it.

    Schema 2 added ``version``, ``version_id``, ``tools`` and the adapter kinds;
    a schema 1 record (kind 'python', no version) is read as version 0.
    """

    readable_schema_versions: ClassVar[frozenset[int]] = frozenset({1, 2})
    schema_version: int = 2

    name: str = Field(description="Registered name, unique within a project.")
    version: int = Field(
        0, ge=0, description="Registry version number (1, 2 ...); 0: not from the registry."
    )
    version_id: int | None = Field(
        None, description="Registry id of the version; names its dispatch pause flag in Redis."
    )
    kind: EnvironmentKind = Field(
        description="How producers load it. 'python': a class named by `entrypoint`; the other "
        "kinds are adapters (ADAPTER_ENTRYPOINTS) configured by `params`."
    )
    entrypoint: str = Field(
        "", description="`module:Class` implementing environments.Environment; "
        "filled in from the kind for adapters."
    )
    params: dict = Field(
        default_factory=dict, description="The registered settings: keyword arguments for the class."
    )
    tools: tuple[ToolSchema, ...] = Field(
        (), description="Tools the environment must expose, exactly; the probe checks them."
    )

    @model_validator(mode="before")
    @classmethod
    def _upgrade_and_fill_adapter(cls, data):
        if isinstance(data, dict):
            if data.get("schema_version") == 1:
                data = {**data, "schema_version": 2}
            adapter = ADAPTER_ENTRYPOINTS.get(data.get("kind", ""))
            if adapter is not None and not data.get("entrypoint"):
                data = {**data, "entrypoint": adapter}
        return data

    @model_validator(mode="after")
    def _entrypoint_fits_kind(self):
        adapter = ADAPTER_ENTRYPOINTS.get(self.kind)
        if adapter is not None and self.entrypoint != adapter:
            raise ValueError(f"kind {self.kind!r} always loads {adapter}, not {self.entrypoint!r}")
        if adapter is None and not self.entrypoint:
            raise ValueError("kind 'python' needs an entrypoint 'module:Class'")
        return self

    @property
    def label(self) -> str:
        return f"{self.name}@{self.version}" if self.version else self.name


class RunSpec(_Record):
    """What a producer needs to run episodes for a run; written by the trainer on claim."""

    run_id: int
    config: dict = Field(description="The run's validated RunConfig, as JSON.")
    environment: EnvironmentSpec


class EpisodeTimings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    started_at: float = Field(description="Unix time the episode started.")
    finished_at: float = Field(description="Unix time the episode ended.")
    generation_s: float = Field(description="Seconds spent waiting for the policy to generate.")
    environment_s: float = Field(description="Seconds spent waiting on environment reset/step (tool calls excluded).")
    tool_s: float = Field(0.0, description="Seconds spent waiting on the environment's tool calls.")


class TrajectoryRecord(_Record):
    """One finished episode, as appended to :func:`trajectory_stream`.

    ``token_ids`` is the whole conversation; ``loss_mask`` is 1 exactly on the
    tokens the policy generated and 0 on prompt, environment and tool tokens.
    ``behaviour_logprobs`` holds the sampling policy's log-probability of each
    token (0.0 where the mask is 0).
    """

    trajectory_id: str = Field(default_factory=lambda: uuid.uuid4().hex)
    run_id: int
    group_id: str = Field(description="Episodes of one group share a task; GRPO compares them.")
    group_size: int = Field(description="How many episodes the group has in total.")
    environment: str
    policy_version: int = Field(
        description="Oldest policy version that generated any of its tokens; staleness is measured from it."
    )
    policy_versions: list[int] = Field(
        default_factory=list,
        description="Policy version of each policy turn's first token, in order; weights may change between turns.",
    )
    newest_policy_version: int | None = Field(
        None,
        description="Version of the newest weights that generated any of its tokens: newer than "
        "max(policy_versions) when weights changed within a turn (between decode chunks). "
        "None in records from before this field: read as max(policy_versions).",
    )
    token_ids: list[int]
    behaviour_logprobs: list[float]
    loss_mask: list[int]
    reward: float
    status: Literal["ok", "failed"] = "ok"
    failure_reason: str = ""
    num_turns: int = 0
    timings: EpisodeTimings

    @model_validator(mode="after")
    def _aligned(self):
        n = len(self.token_ids)
        if len(self.behaviour_logprobs) != n or len(self.loss_mask) != n:
            raise ValueError(
                "token_ids, behaviour_logprobs and loss_mask must have the same length "
                f"(got {n}, {len(self.behaviour_logprobs)}, {len(self.loss_mask)})"
            )
        return self

    def newest_version(self) -> int:
        """The newest policy version that generated any of its tokens."""
        if self.newest_policy_version is not None:
            return self.newest_policy_version
        return max(self.policy_versions, default=self.policy_version)

    def to_stream_fields(self) -> dict[str, str]:
        return {"schema_version": str(self.schema_version), "payload": self.model_dump_json()}

    @classmethod
    def from_stream_fields(cls, fields: dict) -> TrajectoryRecord:
        decoded = {
            (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
            for k, v in fields.items()
        }
        if int(decoded.get("schema_version", -1)) != SCHEMA_VERSION:
            raise SchemaVersionError(
                f"trajectory schema_version {decoded.get('schema_version')} is not supported"
            )
        return cls.model_validate_json(decoded["payload"])

TrainerStage = Literal["data_wait", "batch", "host_to_device", "compute", "publish", "checkpoint", "telemetry",
                       "other"]

#: Version of the stage vocabulary and its meaning; a chart keyed by stage names can tell a change apart.
STAGE_TIMELINE_VERSION = 1


class StageSpan(BaseModel):
    """One stage of a trainer step, between two host timestamps (unix seconds)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: TrainerStage = Field(
        description="data_wait: blocked on trajectories (RL) or demonstrations; batch: building the padded "
        "batch on the host; host_to_device: the batch's transfer, to block_until_ready; compute: the jitted "
        "train step to block_until_ready of its outputs. Forward, backward AND the optimizer update: the "
        "step is one fused XLA program; split into a gradient and an update program it ran 4-7% slower "
        "(CPU, nano model), so no separate optimizer stage is reported rather than a guessed one. publish: serialising and publishing weights; checkpoint: starting "
        "an (asynchronous) checkpoint save; telemetry: step bookkeeping, posting telemetry and traces; "
        "other: whatever lies between the stages above."
    )
    started_at: float
    ended_at: float

    @property
    def seconds(self) -> float:
        return self.ended_at - self.started_at


class StepTimeline(BaseModel):
    """A trainer step's stages, contiguous and in order: their seconds sum to the step's wall time."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    version: int = Field(STAGE_TIMELINE_VERSION, description="Version of the stage vocabulary.")
    spans: list[StageSpan] = Field(default_factory=list)

    def seconds_by_stage(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for span in self.spans:
            totals[span.name] = totals.get(span.name, 0.0) + span.seconds
        return totals


class DeviceSample(BaseModel):
    """One local accelerator of the trainer, as sampled with its host's :class:`DeviceReport`.

    Each figure is None where nothing reports it for this device: absent, never
    guessed (no allocator figures on CPU, no NVML figures off NVIDIA GPUs or where
    the GPU cannot be matched to its NVML entry, no libtpu figures off TPU).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: int = Field(description="`jax.Device.id`: unique among the job's devices, all hosts together.")
    process_index: int = Field(description="`jax.Device.process_index`: the JAX process (host) it belongs to.")
    local_hardware_id: int | None = Field(
        None, description="The backend's local ordinal (the CUDA ordinal on GPU); None where the backend has none."
    )
    platform: str = Field(description="JAX backend of the device: cpu, gpu or tpu.")
    device_kind: str = Field(description="`jax.Device.device_kind`, e.g. 'NVIDIA H100 80GB HBM3', 'TPU v5 lite'.")
    memory_in_use_bytes: int | None = Field(
        None, description="XLA allocator: bytes in use on the device (`memory_stats()['bytes_in_use']`)."
    )
    memory_peak_bytes: int | None = Field(
        None, description="XLA allocator: the most bytes ever in use on the device (`peak_bytes_in_use`)."
    )
    memory_limit_bytes: int | None = Field(
        None, description="XLA allocator: the bytes it may use on the device (`bytes_limit`)."
    )
    duty_cycle: float | None = Field(
        None, description="Share of the trainer's wall time in the compute stage since the last report, 0-1. "
        "Measured from the host's stage timeline, not by a hardware counter: the same SPMD step runs on "
        "every device of the mesh, so every device has the trainer's duty cycle."
    )
    mfu: float | None = Field(
        None, description="The job's model FLOPs utilisation since the last report (see DeviceReport.mfu): "
        "the step's FLOPs are split evenly over the mesh, so every device has the job's MFU. None on a "
        "device kind of unknown peak."
    )
    nvml_index: int | None = Field(
        None, description="NVML's index of this GPU, when it was matched by PCI bus id or by CUDA ordinal "
        "(see trainer/devices.py); None when NVML is absent or the match is not certain."
    )
    nvml_utilisation: float | None = Field(
        None, description="NVML: share of the last sample period (1/6 s to 1 s, by GPU) in which a kernel ran "
        "on this GPU, 0-1. Kernels of every process count."
    )
    nvml_memory_used_bytes: int | None = Field(
        None, description="NVML: memory used on this GPU by every process (what nvidia-smi shows)."
    )
    nvml_memory_total_bytes: int | None = Field(None, description="NVML: this GPU's memory.")
    tpu_duty_cycle: float | None = Field(
        None, description="libtpu monitoring: the TensorCore duty cycle of this device's chip, 0-1."
    )
    tpu_hbm_used_bytes: int | None = Field(None, description="libtpu monitoring: HBM in use by this device.")
    tpu_hbm_total_bytes: int | None = Field(None, description="libtpu monitoring: this device's HBM.")


EpisodeOutcome = Literal["trained", "failed", "dropped_stale", "dropped_filtered", "dropped_incomplete"]

#: Longest failure reason an :class:`EpisodeSpan` carries: enough to say what broke, no stack traces.
EPISODE_SPAN_REASON_CHARS = 160


class EpisodeSpan(BaseModel):
    """One episode a trainer step consumed, as the timeline draws it: when it ran and what became of it.

    Compact on purpose (no tokens): a step event carries one for EVERY trajectory
    the step consumed. ``generation_s``, ``environment_s`` and ``tool_s`` are
    totals over the episode's turns, which interleave; the rest of its wall time
    is the producer's own (scheduling, queueing for a slot).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    trajectory_id: str = Field(description="The trajectory's id (TrajectoryRecord.trajectory_id).")
    group_id: str = Field(description="Its episode group: GRPO's baseline, consumed whole.")
    environment: str = Field(description="The environment's name, as rollout metrics key it.")
    status: Literal["ok", "failed"] = Field(description="The producer's verdict on the episode.")
    failure_reason: str = Field("", description=f"Truncated to {EPISODE_SPAN_REASON_CHARS} characters.")
    started_at: float = Field(description="Unix time the episode started (producer's clock).")
    finished_at: float = Field(description="Unix time the episode ended (producer's clock).")
    generation_s: float = Field(description="Seconds its turns waited for the policy to generate.")
    environment_s: float = Field(description="Seconds it waited on environment reset/step.")
    tool_s: float = Field(0.0, description="Seconds it waited on tool calls.")
    policy_version: int = Field(description="Oldest policy version that generated any of its tokens.")
    newest_policy_version: int = Field(description="Newest such version; differs when weights changed mid-episode.")
    reward: float = Field(description="The episode's reward (null in the stored JSON when not finite).")
    outcome: EpisodeOutcome = Field(
        description="trained: in the step's update; failed: consumed with its group but fully masked "
        "(status failed); dropped_stale: its group exceeded max_staleness and was consumed untrained; "
        "dropped_filtered: the algorithm's dynamic sampling dropped its group (no reward variance); "
        "dropped_incomplete: its group was given up on (a sibling never arrived: a dead producer)."
    )

    @classmethod
    def from_record(cls, record: TrajectoryRecord, *, outcome: EpisodeOutcome) -> EpisodeSpan:
        timings = record.timings
        return cls(
            trajectory_id=record.trajectory_id, group_id=record.group_id, environment=record.environment,
            status=record.status,
            # PostgreSQL's jsonb holds no NUL; a reason is for people to read, so it is simply cut out.
            failure_reason=record.failure_reason.replace("\x00", "")[:EPISODE_SPAN_REASON_CHARS],
            started_at=timings.started_at, finished_at=timings.finished_at,
            generation_s=timings.generation_s, environment_s=timings.environment_s, tool_s=timings.tool_s,
            policy_version=record.policy_version,
            newest_policy_version=record.newest_version(),
            reward=record.reward, outcome=outcome,
        )


class DeviceReport(BaseModel):
    """The trainer's accelerators and host, sampled now and then (not every step, to stay cheap).

    Every optional field is None where the backend or host does not report it:
    absent, never guessed (no MFU on a device kind of unknown peak, no memory on CPU).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    platform: str = Field(description="JAX backend: cpu, gpu or tpu.")
    device_kind: str = Field(description="`jax.devices()[0].device_kind`, e.g. 'NVIDIA H100 80GB HBM3', 'TPU v5 lite'.")
    device_count: int = Field(description="Devices of the whole job (all hosts).")
    local_device_count: int = Field(description="Devices attached to this host.")
    memory_in_use_bytes: int | None = Field(None, description="Sum over local devices (`memory_stats`).")
    memory_peak_bytes: int | None = Field(None, description="Sum over local devices of their peak in use.")
    memory_limit_bytes: int | None = Field(None, description="Sum over local devices of the allocator's limit.")
    duty_cycle: float | None = Field(
        None, description="Share of the trainer's wall time in the compute stage since the last report."
    )
    mfu: float | None = Field(
        None, description="Model FLOPs (6 x parameters x trained tokens) per wall second over the devices' "
        "peak dense bf16 FLOP/s, since the last report; None on a device kind of unknown peak."
    )
    peak_flops_per_device: float | None = Field(None, description="The peak used for `mfu`.")
    gpu_utilisation: float | None = Field(None, description="NVML: mean GPU utilisation over local GPUs, 0-1.")
    gpu_memory_used_bytes: int | None = Field(None, description="NVML: memory used on local GPUs (all processes).")
    tpu_duty_cycle: float | None = Field(None, description="libtpu monitoring: mean TensorCore duty cycle, 0-1.")
    host_cpu_percent: float | None = Field(None, description="Host CPU use since the last report, 0-100.")
    host_memory_used_bytes: int | None = Field(None, description="Host memory in use (total less available).")
    host_memory_total_bytes: int | None = Field(None, description="Host memory installed.")
    process_cpu_cores: float | None = Field(
        None, description="CPU seconds of the trainer process per wall second since the last report."
    )
    process_rss_bytes: int | None = Field(None, description="Resident memory of the trainer process.")
    hostname: str | None = Field(None, description="The trainer host's name (`socket.gethostname()`).")
    process_id: int | None = Field(None, description="The trainer process's operating-system id.")
    process_index: int | None = Field(
        None, description="`jax.process_index()` of the reporting trainer process (0: the one that posts)."
    )
    devices: list[DeviceSample] = Field(
        default_factory=list,
        description="Each device of this host, in `jax.local_devices()` order. Only the process that posts "
        "telemetry reports, so on a multi-host job the other hosts' devices are not listed "
        "(`device_count - local_device_count` of them). Empty in reports of older trainers.",
    )
    reported_at: float

    def metric_values(self) -> dict[str, float]:
        values = {"device/count": float(self.device_count)}
        for name in ("memory_in_use_bytes", "memory_peak_bytes", "memory_limit_bytes", "duty_cycle", "mfu",
                     "gpu_utilisation", "gpu_memory_used_bytes", "tpu_duty_cycle"):
            value = getattr(self, name)
            if value is not None:
                values[f"device/{name}"] = float(value)
        for name in ("host_cpu_percent", "host_memory_used_bytes"):
            value = getattr(self, name)
            if value is not None:
                values[f"host/{name.removeprefix('host_')}"] = float(value)
        if self.process_cpu_cores is not None:
            values["trainer/cpu_cores"] = self.process_cpu_cores
        if self.process_rss_bytes is not None:
            values["trainer/rss_bytes"] = float(self.process_rss_bytes)
        return values


class TrainerStepEvent(_Record):
    """Telemetry of one trainer step, posted to the platform.

    ``wait_s + compute_s + publish_s + other_s == wall_s``: the stages cover the
    whole step so the idle fraction is honest.
    """

    run_id: int
    step: int = Field(description="Trainer step, counted over SFT and RL phases together.")
    phase: Literal["sft", "rl"]
    policy_version: int
    wall_s: float
    wait_s: float = Field(description="Blocked waiting for trajectories.")
    compute_s: float = Field(description="Train step on device, to block_until_ready.")
    publish_s: float = Field(description="Serialising and publishing weights.")
    other_s: float = Field(description="Checkpointing, batching and bookkeeping.")
    loss: float
    reward_mean: float | None = None
    success_rate: float | None = None
    samples_per_s: float | None = None
    staleness_mean: float | None = None
    staleness_max: float | None = None
    failed_episodes: int = 0
    producer_utilisation: float | None = Field(
        None, description="Mean over producer processes of the step's share of time with a rollout task running."
    )
    producers_reporting: int = Field(0, description="Producer processes that reported on the run so far.")
    circuit_breakers_open: dict[str, int] = Field(
        default_factory=dict,
        description="Per environment: producer processes whose circuit breaker for it is open or half-open.",
    )
    samples_produced_per_s: float | None = Field(
        None, description="Trajectories producers appended to the stream per second during the step."
    )
    tokens_per_s: float | None = Field(
        None, description="Tokens the update trained on (the batch's non-padding tokens: prompt, environment "
        "and model turns alike, as the forward and backward passes see them) per wall second of the step.",
    )
    rollout_metrics: dict[str, float] = Field(
        default_factory=dict,
        description="Per environment: rollout latency p50/p90/p99 (total, generation, environment) and error rate.",
    )
    episodes_lost: int = Field(
        0, description="Episodes of groups given up on in this step: requested, never delivered (dead producer)."
    )
    staleness_histogram: dict[str, int] = Field(
        default_factory=dict,
        description="Trained trajectories by staleness in policy versions (trainer version - oldest version used).",
    )
    staleness_in_queue_histogram: dict[str, int] = Field(
        default_factory=dict,
        description="Trained trajectories by versions published after their last policy turn (waiting in queue).",
    )
    staleness_in_flight_histogram: dict[str, int] = Field(
        default_factory=dict,
        description="Trained trajectories by versions published during their generation (max - min policy_versions).",
    )
    queue_wait_s_mean: float | None = Field(
        None, description="Mean seconds from an episode's end to its consumption by the trainer."
    )
    queue_wait_s_max: float | None = Field(None, description="Longest such wait in the step.")
    stale_trajectories_dropped: int = Field(
        0, description="Trajectories dropped before the loss for exceeding max_staleness."
    )
    stale_groups_dropped: int = Field(0, description="Whole episode groups those drops came from.")
    stale_drop_rate: float | None = Field(
        None, description="Dropped / (dropped + trained) trajectories in the step."
    )
    algorithm_metrics: dict[str, float] = Field(
        default_factory=dict,
        description="The loss's own scalars (clip fractions, KL, entropy, importance ratio stats ...).",
    )
    timeline: StepTimeline | None = Field(
        None, description="The step's stages with host timestamps; the four *_s fields above are derived from it."
    )
    producer_timings: dict[str, float] = Field(
        default_factory=dict,
        description="Producers' time over the step: generation/environment/tool/stream_put shares of their "
        "episode time, and stream_put_s (seconds blocked appending trajectories: back-pressure).",
    )
    device: DeviceReport | None = Field(None, description="Present on the steps that carry a device sample.")
    episodes: list[EpisodeSpan] = Field(
        default_factory=list,
        description="Every trajectory the step consumed (trained, failed, dropped as stale or filtered), "
        "including those consumed while an earlier update was skipped; empty in SFT steps and from "
        "trainers older than this field. Not turned into metric values: the platform keeps them for "
        "its timeline.",
    )
    emitted_at: float

    @property
    def trainer_idle_fraction(self) -> float:
        return self.wait_s / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def trainer_utilisation(self) -> float:
        """Share of the step's wall time on device compute (optimizer included, see StageSpan)."""
        return self.compute_s / self.wall_s if self.wall_s > 0 else 0.0

    def metric_values(self) -> dict[str, float]:
        """Flat series name -> value, as stored and charted by the platform."""
        values = {
            "loss": self.loss,
            "wall_s": self.wall_s,
            "trainer_utilisation": self.trainer_utilisation,
            "wait_s": self.wait_s,
            "compute_s": self.compute_s,
            "publish_s": self.publish_s,
            "other_s": self.other_s,
            "trainer_idle_fraction": self.trainer_idle_fraction,
            "policy_version": float(self.policy_version),
            "failed_episodes": float(self.failed_episodes),
            "episodes_lost": float(self.episodes_lost),
        }
        values.update(self.rollout_metrics)
        if self.producer_utilisation is not None:
            values["producers/utilisation"] = self.producer_utilisation
        values["producers/reporting"] = float(self.producers_reporting)
        for environment, count in self.circuit_breakers_open.items():
            values[f"producers/circuit_open/{environment}"] = float(count)
        for name in ("reward_mean", "success_rate", "samples_per_s", "samples_produced_per_s",
                     "tokens_per_s", "staleness_mean", "staleness_max"):
            value = getattr(self, name)
            if value is not None:
                values[name] = value
        for kind, histogram in (("total", self.staleness_histogram),
                                ("in_queue", self.staleness_in_queue_histogram),
                                ("in_flight", self.staleness_in_flight_histogram)):
            for bucket, count in histogram.items():
                values[f"staleness/{kind}/{bucket}"] = float(count)
        for name in ("queue_wait_s_mean", "queue_wait_s_max", "stale_drop_rate"):
            value = getattr(self, name)
            if value is not None:
                values[f"staleness/{name}"] = value
        values["staleness/trajectories_dropped"] = float(self.stale_trajectories_dropped)
        for name, value in self.algorithm_metrics.items():
            values.setdefault(f"algorithm/{name}", value)
        if self.timeline is not None:
            for stage, seconds in self.timeline.seconds_by_stage().items():
                values[f"stage/{stage}_s"] = seconds
        for name, value in self.producer_timings.items():
            values[f"producers/{name}"] = value
        if self.device is not None:
            values.update(self.device.metric_values())
        return values


class ProbeTimeouts(BaseModel):
    """Seconds each probe check may take before it fails as timed out."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Resolving a remote URL's host name on the worker.
    url: float = Field(10.0, gt=0)
    # Loading imports the module and builds the instance; a reasoning-gym dataset takes seconds.
    load: float = Field(60.0, gt=0)
    reset: float = Field(20.0, gt=0)
    # Reading the declared tools (a property may do I/O) and checking their schemas.
    tools: float = Field(10.0, gt=0)
    step: float = Field(20.0, gt=0)
    close: float = Field(10.0, gt=0)


ProbePurpose = Literal["registration", "health", "manual"]

# What the probe sends as the policy's turn: a policy can say anything,
# including nothing, and a conforming environment answers it without crashing.
PROBE_ACTION = ""


class ProbeRequest(_Record):
    """What a probe task runs, written by the platform to :func:`probe_request_key`."""

    probe_id: int
    purpose: ProbePurpose
    environment: EnvironmentSpec
    timeouts: ProbeTimeouts = Field(default_factory=ProbeTimeouts)
    url_allowlist: tuple[str, ...] | None = Field(
        None, description="Hosts and networks remote URLs may reach; None: all but link-local "
        "and cloud-metadata addresses (tandem.environment_urls)."
    )


class ProbeCheck(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="url, load, sample_task, reset, tools, step or close.")
    status: Literal["passed", "failed", "skipped"]
    message: str = ""
    latency_s: float | None = Field(None, description="Wall time of the check; None if skipped.")
    timeout_s: float | None = Field(None, description="Its limit; None if it has none.")


class ProbeReport(_Record):
    """A probe's outcome, sent back to the platform as the argument of PROBE_REPORT_TASK_NAME."""

    probe_id: int
    checks: tuple[ProbeCheck, ...]
    worker: str = Field("", description="`hostname:pid` of the worker that ran it.")
    started_at: float
    finished_at: float

    @property
    def passed(self) -> bool:
        return all(check.status == "passed" for check in self.checks)


class TraceRequest(BaseModel):
    """A user's request for a `jax.profiler` trace of the trainer's next ``steps`` steps."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: int = Field(description="The platform's id of the request; the trainer uploads the trace under it.")
    steps: int = Field(ge=1, description="Trainer steps to trace.")


class TelemetryReply(_Record):
    """The platform's answer to a telemetry post: what it stored, and the traces it wants."""

    stored: int
    trace_requests: list[TraceRequest] = Field(
        default_factory=list, description="Requested traces of the run not yet uploaded, oldest first."
    )


RunReportedStatus = Literal["running", "finished", "failed"]


class TrainerHeartbeat(_Record):
    """Liveness and progress the trainer reports for a run it owns."""

    # None: liveness only. The trainer process beats from a thread of its own, so
    # a long compile or checkpoint is never mistaken for a dead trainer.
    status: RunReportedStatus | None = "running"
    policy_version: int = 0
    trainer_step: int = 0
    message: str = ""
    # Who sends it (``hostname:pid``): a trainer that lost the run to another
    # (it was presumed dead and the run resumed elsewhere) is told so and stops.
    worker: str = ""



class CheckpointInfo(BaseModel):
    """One committed Orbax checkpoint of a run, as the trainer sees it on disk."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step: int = Field(ge=0, description="Updates the checkpointed train state holds.")
    policy_version: int = Field(ge=-1, description="Newest policy version published when it was saved.")
    path: str = Field(min_length=1, description="The step directory on the shared filesystem.")
    size_bytes: int = Field(ge=0, description="Bytes of every file in the step directory.")


class CheckpointReport(_Record):
    """Every committed checkpoint of a run now on disk; those missing from it were removed by retention."""

    checkpoints: list[CheckpointInfo]


class LineageEntry(_Record):
    """One decision of the trainer about consumed trajectories, appended to :func:`lineage_stream`.

    After a resume from a checkpoint the steps past it are trained again: the
    newest ``trained`` entry of a step is the one the surviving parameters went
    through, and across those entries no trajectory id appears twice.
    """

    kind: Literal["trained", "dropped", "lost"] = Field(
        description="trained: the update of `step` used them; dropped: consumed untrained (too stale, "
        "or no reward variance under dynamic sampling); lost: groups given up on (their producer died)."
    )
    step: int = Field(description="Trainer step: the update's own for `trained`, the last one before otherwise.")
    policy_version: int = Field(description="Policy version published by the trainer at that point.")
    worker: str = Field(description="The trainer process (`hostname:pid`) that decided.")
    trajectory_ids: list[str] = Field(default_factory=list)
    group_ids: list[str] = Field(default_factory=list)

    def to_stream_fields(self) -> dict[str, str]:
        return {"schema_version": str(self.schema_version), "payload": self.model_dump_json()}

    @classmethod
    def from_stream_fields(cls, fields: dict) -> LineageEntry:
        payload = fields.get(b"payload", fields.get("payload"))
        return cls.model_validate_json(payload)


class CircuitBreakerReport(_Record):
    """One producer process's circuit breaker for one environment."""

    state: Literal["closed", "open", "half_open"]
    consecutive_failures: int = 0
    last_failure_reason: str = ""


class ProducerReport(_Record):
    """What a producer process says of itself; written to :func:`producers_key` at each task's start and end."""

    worker: str = Field(description="`hostname:pid` of the producer process.")
    reported_at: float = Field(description="Unix time of the report.")
    uptime_s: float = Field(description="Seconds since the process started its first rollout task.")
    busy_s: float = Field(description="Of those, seconds with at least one rollout task running (any run).")
    running_tasks: int = Field(description="Rollout tasks running at the time of the report.")
    episodes: int = Field(0, description="Episodes this process finished for the run.")
    episodes_failed: int = Field(0, description="Of those, episodes that failed.")
    circuit_breakers: dict[str, CircuitBreakerReport] = Field(default_factory=dict)
    # Cumulative over this process's episodes of the run. Episodes run concurrently,
    # so these are episode-seconds: their ratios, not their sum with uptime, mean something.
    episode_s: float = Field(0.0, description="Sum of the wall seconds of the run's finished episodes.")
    generation_s: float = Field(0.0, description="Of those, seconds waiting for the policy to generate.")
    environment_s: float = Field(0.0, description="Of those, seconds waiting on environment reset/step.")
    tool_s: float = Field(0.0, description="Of those, seconds waiting on tool calls.")
    stream_put_s: float = Field(
        0.0, description="Seconds spent appending the run's finished trajectories to its stream (back-pressure)."
    )
    cpu_s: float | None = Field(None, description="CPU seconds this process used since it started (psutil).")
    rss_bytes: int | None = Field(None, description="Resident memory of this process (psutil).")

    def busy_and_uptime_at(self, now: float) -> tuple[float, float]:
        """``(busy_s, uptime_s)`` extrapolated to ``now``: tasks still running keep the process busy."""
        elapsed = max(now - self.reported_at, 0.0)
        return self.busy_s + (elapsed if self.running_tasks else 0.0), self.uptime_s + elapsed


ProcessRole = Literal["web", "platform_worker", "rollout_worker", "trainer"]


class ProcessReport(_Record):
    """What a Tandem process says of its own CPU and memory and its host's; see ``tandem/process_reports.py``.

    Every process (web server, platform worker and its beat, rollout workers, trainers) writes one to
    :func:`process_reports_key` every ``interval_s`` seconds, busy or idle.
    """

    role: ProcessRole
    name: str = Field("", description="What the process calls itself where that tells processes of one role "
                      "apart: the Celery node name (`rollouts-1@host`), `celery beat`, `uvicorn`.")
    hostname: str = Field(description="`socket.gethostname()` of the process's host.")
    pid: int = Field(description="The process's operating-system id.")
    started_at: float = Field(description="Unix time the process started (psutil `create_time`).")
    reported_at: float = Field(description="Unix time of this report.")
    interval_s: float = Field(description="Seconds between this process's reports; a reader counts a report "
                              "older than 3 intervals as the report of a dead process.")
    cpu_cores: float = Field(description="CPU seconds (user + system, all threads) of this process per wall "
                             "second since its previous report; on its first report, since it started.")
    rss_bytes: int = Field(description="Resident memory of this process.")
    host_cpu_count: int = Field(description="Logical CPUs of the host (`psutil.cpu_count()`).")
    host_cpu_percent: float | None = Field(
        None, description="Host CPU use since this process's previous report, 0-100 (all CPUs); None on its "
        "first report, which has no previous sample."
    )
    host_memory_used_bytes: int = Field(description="Host memory in use (total less available).")
    host_memory_total_bytes: int = Field(description="Host memory installed.")
    run_ids: list[int] = Field(default_factory=list, description="Runs the process is working on now: "
                               "a rollout worker's running tasks' runs, a trainer's claimed run.")

    @property
    def field(self) -> str:
        return process_report_field(self.role, self.hostname, self.pid)

    def is_live(self, now: float) -> bool:
        """Reported within 3 of its intervals: a live process never misses that many."""
        return now - self.reported_at <= 3 * self.interval_s


TurnRole = Literal["prompt", "policy", "environment", "tool"]


class TokenSpan(BaseModel):
    """A run of consecutive tokens of a turn that the loss either trained on or masked out."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str = Field(description="The tokens decoded; special tokens written as ⟨bos⟩, ⟨eos⟩, ⟨pad⟩.")
    tokens: int = Field(ge=1, description="How many tokens the span has.")
    trained: bool = Field(description="True: the loss mask is 1 on every token of it (policy tokens).")


class ToolCallSample(BaseModel):
    """A tool call a policy turn made, as the producer parsed it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    arguments: dict = Field(default_factory=dict)


class TrajectoryTurn(BaseModel):
    """One turn of a sampled conversation, with its tokens' loss mask as spans."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: TurnRole = Field(
        description="prompt: the reset's observation (and tool header); policy: generated; "
        "tool: the results of the previous policy turn's tool calls; environment: a step's observation."
    )
    text: str
    spans: tuple[TokenSpan, ...] = Field(description="The turn's tokens, run-length encoded by the loss mask.")
    policy_version: int | None = Field(None, description="Policy version that generated it (policy turns).")
    tool_calls: tuple[ToolCallSample, ...] = Field((), description="Calls the turn made (policy turns).")


class TrajectorySample(_Record):
    """A trajectory the trainer trained on in ``step``, readable by people; posted to the platform.

    Built from a :class:`TrajectoryRecord` and the run's tokenizer by
    ``trainer.trajectory_samples``. ``turns`` cover every token of the record in order.
    """

    trajectory_id: str
    run_id: int
    step: int = Field(description="The trainer step whose update used it.")
    selected_because: Literal["best", "worst", "failed"] = Field(
        description="Why the trainer sent it: the step's best or worst reward, or a failed episode."
    )
    group_id: str
    environment: str
    reward: float
    status: Literal["ok", "failed"]
    failure_reason: str = ""
    policy_version: int = Field(description="Oldest policy version of any of its turns.")
    policy_versions: list[int] = Field(default_factory=list, description="Per policy turn, in order.")
    num_tokens: int = Field(ge=0)
    trained_tokens: int = Field(ge=0, description="Tokens the loss mask trains on.")
    started_at: float
    finished_at: float
    turns: tuple[TrajectoryTurn, ...]

    @model_validator(mode="after")
    def _spans_cover_the_tokens(self):
        covered = sum(span.tokens for turn in self.turns for span in turn.spans)
        trained = sum(span.tokens for turn in self.turns for span in turn.spans if span.trained)
        if covered != self.num_tokens or trained != self.trained_tokens:
            raise ValueError(
                f"turns' spans cover {covered} tokens ({trained} trained); "
                f"num_tokens is {self.num_tokens} ({self.trained_tokens} trained)"
            )
        return self
