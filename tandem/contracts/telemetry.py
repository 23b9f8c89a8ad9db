"""What the trainer reports of its steps: stage timelines, episode spans, device reports, traces."""

from __future__ import annotations

import hashlib
from enum import StrEnum
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from tandem.contracts.schema import Record
from tandem.contracts.stages import (
    STAGE_TIMELINE_VERSION,
    TrainerStage,
    stage_meanings,
    stage_metric_name,
)
from tandem.contracts.trajectories import EpisodeStatus, TrajectoryRecord


class StageSpan(BaseModel):
    """One stage of a trainer step, between two host timestamps (unix seconds)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: TrainerStage = Field(description=stage_meanings())
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
    status: EpisodeStatus = Field(description="The producer's verdict on the episode.")
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
        "(status failed); dropped_stale: its group exceeded rollout.max_staleness and was consumed untrained; "
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
        None, description="Model FLOPs (6 x parameters, plus 12 x layers x heads x head_dim x sequence length, "
        "per trained token) per wall second over the devices' peak FLOP/s (peak_flops_source), since the "
        "last report; None on an accelerator of unknown peak."
    )
    peak_flops_per_device: float | None = Field(None, description="The peak used for `mfu`.")
    peak_flops_source: Literal["data_sheet", "measured_matmul"] | None = Field(
        None, description="Where that peak comes from: the device's data sheet (dense bf16), or, on a CPU, "
        "the best of a few float32 1024 x 1024 matmuls measured when the trainer started.",
    )
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
        values = {device_metric_name("device_count"): float(self.device_count)}
        for name in DEVICE_REPORT_DEVICE_FIGURES:
            value = getattr(self, name)
            if value is not None:
                values[device_metric_name(name)] = float(value)
        for name in DEVICE_REPORT_HOST_FIGURES:
            value = getattr(self, name)
            if value is not None:
                values[host_metric_name(name)] = float(value)
        for name in DEVICE_REPORT_PROCESS_FIGURES:
            value = getattr(self, name)
            if value is not None:
                values[trainer_process_metric_name(name)] = float(value)
        # Per device too, so that one device running out of memory or idling shows over time.
        for device in self.devices:
            for name in DEVICE_SAMPLE_FIGURES:
                value = getattr(device, name)
                if value is not None:
                    values[device_metric_name(name, device_id=device.id)] = float(value)
        return values


#: The fields of a DeviceReport that become series (:meth:`DeviceReport.metric_values`): the devices'
#: (``device/<field>``), the host's (``host/<field less host_>``) and the trainer process's
#: (``trainer/<field less process_>``), and each device's (``device/<id>/<field>``).
DEVICE_REPORT_DEVICE_FIGURES = ("memory_in_use_bytes", "memory_peak_bytes", "memory_limit_bytes", "duty_cycle",
                                "mfu", "gpu_utilisation", "gpu_memory_used_bytes", "tpu_duty_cycle")
DEVICE_REPORT_HOST_FIGURES = ("host_cpu_percent", "host_memory_used_bytes")
DEVICE_REPORT_PROCESS_FIGURES = ("process_cpu_cores", "process_rss_bytes")
DEVICE_SAMPLE_FIGURES = ("memory_in_use_bytes", "nvml_utilisation")
#: The first part of the names of those series, and of the producers' (``producers/...``).
DEVICE_SERIES_PREFIX = "device/"
HOST_SERIES_PREFIX = "host/"
TRAINER_PROCESS_SERIES_PREFIX = "trainer/"
PRODUCERS_SERIES_PREFIX = "producers/"


def device_metric_name(field: str, *, device_id: int | None = None) -> str:
    """The series of a DeviceReport's ``field`` over the host's devices (``device/mfu``; ``device_count``
    is ``device/count``), or with ``device_id`` of that device's DeviceSample ``field``
    (``device/0/memory_in_use_bytes``). Raises ValueError for a field the report does not turn into a series."""
    if device_id is not None:
        if field not in DEVICE_SAMPLE_FIGURES:
            raise ValueError(f"{field!r} is not a per-device series: one of {DEVICE_SAMPLE_FIGURES}")
        return f"{DEVICE_SERIES_PREFIX}{device_id}/{field}"
    if field == "device_count":
        return f"{DEVICE_SERIES_PREFIX}count"
    if field not in DEVICE_REPORT_DEVICE_FIGURES:
        raise ValueError(f"{field!r} is not a device series: one of {DEVICE_REPORT_DEVICE_FIGURES}")
    return f"{DEVICE_SERIES_PREFIX}{field}"


def host_metric_name(field: str) -> str:
    """The series of a DeviceReport's host ``field``: ``host_cpu_percent`` is ``host/cpu_percent``."""
    if field not in DEVICE_REPORT_HOST_FIGURES:
        raise ValueError(f"{field!r} is not a host series: one of {DEVICE_REPORT_HOST_FIGURES}")
    return HOST_SERIES_PREFIX + field.removeprefix("host_")


def trainer_process_metric_name(field: str) -> str:
    """The series of a DeviceReport's trainer-process ``field``: ``process_rss_bytes`` is ``trainer/rss_bytes``."""
    if field not in DEVICE_REPORT_PROCESS_FIGURES:
        raise ValueError(f"{field!r} is not a trainer process series: one of {DEVICE_REPORT_PROCESS_FIGURES}")
    return TRAINER_PROCESS_SERIES_PREFIX + field.removeprefix("process_")


def producers_metric_name(figure: str) -> str:
    """The series of a figure over all producers of a step: ``producers/rss_bytes``, ``producers/utilisation``."""
    return f"{PRODUCERS_SERIES_PREFIX}{figure}"


#: What each producer process's series records (``producers/<worker>/<figure>``), per trainer step.
PRODUCER_FIGURES = ("utilisation", "cpu_cores", "rss_bytes")
#: The longest series name the platform stores (its MetricPoint.name).
METRIC_NAME_LENGTH_MAX = 64
#: The longest environment or dataset label a series name holds whole. A longer one is cut to its
#: first 23 characters, ``~`` and 8 hex digits of its SHA-256 (32 characters again), so that every
#: per-label series fits the platform's 64 characters with its prefix and suffix.
METRIC_LABEL_LENGTH_MAX = 32
_CUT_LABEL_HASH_DIGITS = 8


def metric_series_label(label: str) -> str:
    """``label`` as series names hold it: whole up to :data:`METRIC_LABEL_LENGTH_MAX` characters, else cut
    with a hash. Deterministic, so that every process names a label's series alike, and the same for
    every series of the label, so that its series chart as one family; two labels that share their
    first 23 characters still differ by their hash (32 bits: about 1 in 4 billion to clash)."""
    if len(label) <= METRIC_LABEL_LENGTH_MAX:
        return label
    digest = hashlib.sha256(label.encode()).hexdigest()[:_CUT_LABEL_HASH_DIGITS]
    return f"{label[:METRIC_LABEL_LENGTH_MAX - 1 - _CUT_LABEL_HASH_DIGITS]}~{digest}"


def metric_series_name(prefix: str, label: str, suffix: str = "") -> str:
    """The series of one environment's (or dataset's) figure: ``<prefix>/<label>/<suffix>``, or
    ``<prefix>/<label>`` without a suffix, with the label as :func:`metric_series_label` cuts it.

    Every name that carries an environment's or a dataset's label is made here (the idle,
    circuit-breaker, rollout and evaluation series), so that a label as long as the registry
    allows names a series the platform stores. Raises ValueError when ``prefix`` and ``suffix``
    alone leave the name longer than :data:`METRIC_NAME_LENGTH_MAX`.
    """
    name = f"{prefix}/{metric_series_label(label)}" + (f"/{suffix}" if suffix else "")
    if len(name) > METRIC_NAME_LENGTH_MAX:
        raise ValueError(f"the series name {name!r} is longer than {METRIC_NAME_LENGTH_MAX} characters: "
                         f"its prefix or suffix leaves no room for a label")
    return name


#: The prefix of every per-environment rollout series (``rollout/<environment>/<figure>``).
ROLLOUT_SERIES_PREFIX = "rollout"
#: The figure of an environment's tool-call rate: the share of a step's episodes that called a tool
#: and saw it run. The trainer reports it for each environment that offers tools; the platform's
#: ``tools_unused`` alert rules read it.
TOOL_CALL_RATE_FIGURE = "tool_call_rate"


def tool_call_rates(values: dict[str, float]) -> dict[str, float]:
    """The tool-call rate series among a step's ``values``, by series name."""
    ending = f"/{TOOL_CALL_RATE_FIGURE}"
    return {name: value for name, value in values.items()
            if name.startswith(f"{ROLLOUT_SERIES_PREFIX}/") and name.endswith(ending)}


def producer_metric_name(worker: str, figure: str) -> str:
    """The series of one producer process's figure: ``producers/rollouts-1@gpu-host-2:311/cpu_cores``.

    A worker name too long for the platform's 64 characters keeps its end, where ``host:pid`` tells
    processes apart, after a ``~``.
    """
    room = METRIC_NAME_LENGTH_MAX - len(PRODUCERS_SERIES_PREFIX) - len("/") - len(figure)
    if len(worker) > room:
        worker = "~" + worker[-(room - 1):]
    return producers_metric_name(f"{worker}/{figure}")


#: What the trainer waited on when it waited for data (``TrainerStepEvent.idle_seconds``), taken from
#: the episode that completed the step's batch: the last one to arrive.
IdleCause = Literal["generation", "environment", "tool", "capacity", "queue"]
IDLE_CAUSES: dict[str, str] = {
    "generation": "the episode's policy turns: the inference engine generating",
    "environment": "the episode's environment resets and steps",
    "tool": "the episode's tool calls",
    "capacity": "producers at capacity: its rollout task waited for a free producer, or the episode for a "
                "slot of its environment's max_concurrent_episodes",
    "queue": "time in queue: before its group was requested (the backlog and staleness bound held it back), "
             "and from its end until the trainer read and assembled it",
}
if tuple(IDLE_CAUSES) != get_args(IdleCause):
    raise AssertionError("IDLE_CAUSES and IdleCause must list the same causes, in the same order")


def idle_metric_name(environment: str, cause: str) -> str:
    """The series of the trainer's idle seconds spent waiting on ``environment``'s ``cause``: ``idle/shout/environment_s``."""
    return metric_series_name("idle", environment, f"{cause}_s")


def circuit_open_metric_name(environment: str) -> str:
    """The series of how many producers hold ``environment``'s circuit breaker open: ``producers/circuit_open/shout``."""
    return metric_series_name(producers_metric_name("circuit_open"), environment)


#: Series of every trainer step (:meth:`TrainerStepEvent.metric_values`) that the platform's pages name
#: (the run page's charts, the comparison, the run list's reward column).
LOSS_METRIC = "loss"
REWARD_MEAN_METRIC = "reward_mean"
SUCCESS_RATE_METRIC = "success_rate"
POLICY_VERSION_METRIC = "policy_version"
SAMPLES_PER_S_METRIC = "samples_per_s"
SAMPLES_PRODUCED_PER_S_METRIC = "samples_produced_per_s"
TOKENS_PER_S_METRIC = "tokens_per_s"
#: The share of the step's batch that was padding (rows and length buckets): compute spent on nothing.
PADDING_FRACTION_METRIC = f"{TRAINER_PROCESS_SERIES_PREFIX}padding_fraction"


class TrainerStepEvent(Record):
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
    padding_fraction: float | None = Field(
        None, ge=0.0, le=1.0,
        description="Share of the update's batch (rows x padded length) that was padding, 0-1; None in "
        "events of older trainers.",
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
        0, description="Trajectories dropped before the loss for exceeding rollout.max_staleness."
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
        "episode time, and stream_put_s (seconds blocked appending trajectories: back-pressure); "
        "cpu_cores and rss_bytes summed over processes.",
    )
    producer_processes: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description="Each producer process's figures over the step (worker -> figure of PRODUCER_FIGURES -> "
        "value): its share of the step with a rollout task running, CPU cores, resident memory. Stored "
        "as producer_metric_name's series, so they outlive the process and the run.",
    )
    device: DeviceReport | None = Field(None, description="Present on the steps that carry a device sample.")
    episodes: list[EpisodeSpan] = Field(
        default_factory=list,
        description="Every trajectory the step consumed (trained, failed, dropped as stale or filtered), "
        "including those consumed while an earlier update was skipped; empty in SFT steps and from "
        "trainers older than this field. Not turned into metric values: the platform keeps them for "
        "its timeline.",
    )
    idle_seconds: dict[str, dict[IdleCause, float]] = Field(
        default_factory=dict,
        description="The step's wait for data (wait_s) by what it waited on: environment -> cause -> seconds "
        "(IDLE_CAUSES), from the episode on the critical path of each wait (the last to arrive).",
    )
    episodes_total: int | None = Field(
        None, ge=0,
        description="Set when the step's episodes are too many for one post: how many it consumed. "
        "`episodes` then holds the first of them and :class:`StepEpisodes` chunks carry the rest.",
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
            LOSS_METRIC: self.loss,
            "wall_s": self.wall_s,
            "trainer_utilisation": self.trainer_utilisation,
            "wait_s": self.wait_s,
            "compute_s": self.compute_s,
            "publish_s": self.publish_s,
            "other_s": self.other_s,
            "trainer_idle_fraction": self.trainer_idle_fraction,
            POLICY_VERSION_METRIC: float(self.policy_version),
            "failed_episodes": float(self.failed_episodes),
            "episodes_lost": float(self.episodes_lost),
        }
        values.update(self.rollout_metrics)
        for environment, causes in self.idle_seconds.items():
            for cause, seconds in causes.items():
                values[idle_metric_name(environment, cause)] = seconds
        if self.producer_utilisation is not None:
            values[producers_metric_name("utilisation")] = self.producer_utilisation
        values[producers_metric_name("reporting")] = float(self.producers_reporting)
        for environment, count in self.circuit_breakers_open.items():
            values[circuit_open_metric_name(environment)] = float(count)
        for name in (REWARD_MEAN_METRIC, SUCCESS_RATE_METRIC, SAMPLES_PER_S_METRIC, SAMPLES_PRODUCED_PER_S_METRIC,
                     TOKENS_PER_S_METRIC, "staleness_mean", "staleness_max"):
            value = getattr(self, name)
            if value is not None:
                values[name] = value
        if self.padding_fraction is not None:
            values[PADDING_FRACTION_METRIC] = self.padding_fraction
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
                values[stage_metric_name(stage)] = seconds
        for name, value in self.producer_timings.items():
            values[producers_metric_name(name)] = value
        for worker, figures in self.producer_processes.items():
            for figure, value in figures.items():
                values[producer_metric_name(worker, figure)] = value
        if self.device is not None:
            values.update(self.device.metric_values())
        return values


class TraceStatus(StrEnum):
    """Where a user's trace request stands, as the platform records it."""

    REQUESTED = "requested"  # the trainer will trace it at its next steps
    CAPTURED = "captured"
    FAILED = "failed"  # the trainer tried; the trace's ``error`` says why


class TraceRequest(BaseModel):
    """A user's request for a `jax.profiler` trace of the trainer's next ``steps`` steps."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: int = Field(description="The platform's id of the request; the trainer uploads the trace under it.")
    steps: int = Field(ge=1, description="Trainer steps to trace.")


#: The run's series that counts, per step, the series of the step's telemetry the platform refused.
SERIES_REFUSED_METRIC = "telemetry/series_refused"


class RefusedSeries(BaseModel):
    """One value of a telemetry post the platform did not store (the rest of the post is stored)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step: int
    name: str
    reason: str = Field(description="Why, e.g. 'longer than 64 characters'.")


class TelemetryReply(Record):
    """The platform's answer to a telemetry post: what it stored, and the traces it wants."""

    stored: int
    trace_requests: list[TraceRequest] = Field(
        default_factory=list, description="Requested traces of the run not yet uploaded, oldest first."
    )
    refused_series: list[RefusedSeries] = Field(
        default_factory=list, description="Series of the post it could not store, each with why; counted per "
        "step in the run's telemetry/series_refused series.")


class StepEpisodes(Record):
    """A chunk of a step's episodes, posted after its :class:`TrainerStepEvent` (whose ``episodes_total`` is set).

    The platform's request bodies are capped (a few MiB), and a step of thousands of
    episodes is larger: its spans follow in chunks, each placed at ``offset`` of the
    step's list, so a chunk posted twice lands in the same place.
    """

    run_id: int
    step: int
    offset: int = Field(ge=0, description="Index in the step's episode list of this chunk's first episode.")
    episodes: list[EpisodeSpan] = Field(min_length=1)
