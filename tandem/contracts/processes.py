"""What producer processes and every other Tandem process say of themselves in Redis."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from tandem.contracts.keys import process_report_field
from tandem.contracts.schema import Record


class CircuitBreakerReport(Record):
    """One producer process's circuit breaker for one environment."""

    state: Literal["closed", "open", "half_open"]
    consecutive_failures: int = 0
    last_failure_reason: str = ""


ProducerFaultKind = Literal["weights_not_visible", "secrets_undecryptable"]


class ProducerFault(Record):
    """Why producers can never serve a run as it is configured; at :func:`producer_fault_key`.

    The trainer fails the run with ``reason`` instead of waiting for episodes that cannot come.
    """

    kind: ProducerFaultKind = Field(
        description="weights_not_visible: the filesystem weight transport's directory, written on the "
        "trainer's host, does not exist on the producer's host (no storage shared between them). "
        "secrets_undecryptable: the producer's TANDEM_SECRETS_KEY (missing, or not the platform's) "
        "does not decrypt the environment's secret settings (tandem/runtime/secrets_at_rest.py)."
    )
    reason: str = Field(description="For people: what is wrong, naming the path and the hosts, and what to do.")
    producer: str = Field(description="`hostname:pid` of the producer process that found it.")


class ProducerReport(Record):
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


ProcessRole = Literal["web", "platform_worker", "rollout_worker", "trainer", "export_worker"]
#: How the devices page names each role.
PROCESS_ROLE_LABELS: dict[str, str] = {
    "web": "web server", "platform_worker": "platform worker", "rollout_worker": "rollout worker",
    "trainer": "trainer", "export_worker": "export worker",
}


class ProcessReport(Record):
    """What a Tandem process says of its own CPU and memory and its host's; see ``tandem/runtime/process_reports.py``.

    Every process (web server, platform worker and its beat, rollout workers, trainers, export workers) writes one to
    :func:`process_reports_key` every ``interval_s`` seconds, busy or idle.
    """

    # 2: a trainer's device_memory_bytes. Version 1 reports (without it) read as reports of no device memory.
    # 3: a trainer's device_platform. Older reports read as reports of no platform.
    readable_schema_versions: ClassVar[frozenset[int]] = frozenset({1, 2, 3})
    schema_version: int = 3

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
    device_memory_bytes: int | None = Field(
        None, ge=0, description="A trainer's: the memory XLA may use on the smallest of its accelerator devices "
        "(`bytes_limit`), the limit a run's memory plan must fit when the operator declares none "
        "(TANDEM_TRAINER_MEMORY_BYTES). None on CPU, and for the other roles.")
    device_platform: str | None = Field(
        None, max_length=32, description="A trainer's: the JAX platform of its accelerator devices (`tpu`, "
        "`gpu`), which sets how the memory plan counts the step's logits (tandem/configs/memory_plan.py). "
        "None on CPU, and for the other roles.")

    @property
    def field(self) -> str:
        return process_report_field(self.role, self.hostname, self.pid)

    def is_live(self, now: float) -> bool:
        """Reported within 3 of its intervals: a live process never misses that many."""
        return now - self.reported_at <= 3 * self.interval_s
