"""Conformance probes of registered environments: the request a worker runs and the report it sends back."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tandem.contracts.environments import EnvironmentSpec
from tandem.contracts.schema import Record


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
    # Asking for a few demonstrations; a remote environment's are fetched.
    demonstrations: float = Field(20.0, gt=0)
    close: float = Field(10.0, gt=0)


ProbePurpose = Literal["registration", "health", "manual"]

# What the probe sends as the policy's turn: a policy can say anything,
# including nothing, and a conforming environment answers it without crashing.
PROBE_ACTION = ""


class ProbeRequest(Record):
    """What a probe task runs, written by the platform to :func:`probe_request_key`."""

    probe_id: int
    purpose: ProbePurpose
    environment: EnvironmentSpec
    timeouts: ProbeTimeouts = Field(default_factory=ProbeTimeouts)
    url_allowlist: tuple[str, ...] | None = Field(
        None, description="Hosts and networks remote URLs may reach; None: all but link-local "
        "and cloud-metadata addresses (tandem.allowlists.environment_urls)."
    )


class ProbeCheck(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="url, load, sample_task, reset, tools, step, budget, demonstrations or close.")
    status: Literal["passed", "warning", "failed", "skipped"] = Field(
        description="warning: the environment works, but something about it needs attention (the message "
        "says what); it does not fail the probe."
    )
    message: str = ""
    latency_s: float | None = Field(None, description="Wall time of the check; None if skipped.")
    timeout_s: float | None = Field(None, description="Its limit; None if it has none.")


class ProbeReport(Record):
    """A probe's outcome, sent back to the platform as the argument of PROBE_REPORT_TASK_NAME."""

    probe_id: int
    checks: tuple[ProbeCheck, ...]
    worker: str = Field("", description="`hostname:pid` of the worker that ran it.")
    started_at: float
    finished_at: float
    max_concurrent_episodes: int | None = Field(
        None, ge=1, description="The concurrent episodes the environment says it can serve (an HTTP server's "
        "`/schema`, a class's `max_concurrent_episodes`); None: it says nothing."
    )

    @property
    def passed(self) -> bool:
        return all(check.status in ("passed", "warning") for check in self.checks)
