"""Conformance probes of registered environments: the request a worker runs and the report it sends back."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from tandem.contracts.environments import EnvironmentSpec
from tandem.contracts.schema import Record
from tandem.contracts.telemetry import TOOL_CALL_RATE_FIGURE


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
    # The imported model's baseline episodes (ProbeBaselineRequest): loading the model, compiling its
    # engine and a few episodes took about two minutes for SmolLM2-135M on two CPU cores.
    baseline: float = Field(900.0, gt=0)


ProbePurpose = Literal["registration", "health", "manual"]

# What the probe sends as the policy's turn: a policy can say anything,
# including nothing, and a conforming environment answers it without crashing.
PROBE_ACTION = ""


class ProbeBaselineRequest(BaseModel):
    """A few held-out episodes of an imported model against the environment, once its checks passed:
    how often the model calls the environment's tools before anyone trains it (issue 31: GRPO alone has
    no signal from a model that never calls them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1, max_length=1000, description="The imported model's directory (as "
                       "`tandem models import` wrote it), its weights and tokenizer; under the operator's "
                       "model roots (TANDEM_MODEL_ROOTS), which the platform and the worker both check.")
    episodes: int = Field(8, ge=1, le=64, description="Held-out tasks, one episode each: the first tasks "
                          "an evaluation draws, so an evaluation-only run of the model compares.")
    max_turns: int = Field(4, ge=1, le=64, description="Policy turns an episode may take.")
    max_new_tokens: int = Field(128, ge=1, le=4096, description="Tokens a policy turn may generate.")
    max_seq_len: int = Field(1024, ge=64, le=131072, description="The conversation's token budget.")
    temperature: float = Field(0.0, ge=0, le=10, description="0: greedy, as evaluations are by default.")


class ProbeBaseline(BaseModel):
    """What the baseline episodes of :class:`ProbeBaselineRequest` showed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(description="The model directory, as requested.")
    episodes: int = Field(ge=1, description="Episodes played (each ended ok, truncated or failed).")
    statuses: dict[str, int] = Field(default_factory=dict, description="Episodes by status.")
    mean_reward: float
    tool_use: dict[str, float] = Field(default_factory=dict, description="tandem.contracts.tool_use_metrics "
                                       "(tool_call_rate, tool_calls_per_episode, ...); empty when the "
                                       "environment offers no tools.")
    tool_use_ci95: dict[str, tuple[float, float]] = Field(default_factory=dict,
                                                          description="The 95% Wilson intervals of its rates.")
    wall_s: float = Field(ge=0, description="Loading the model, compiling its engine and the episodes.")

    @property
    def tool_call_rate(self) -> float | None:
        return self.tool_use.get(TOOL_CALL_RATE_FIGURE)


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
    baseline: ProbeBaselineRequest | None = Field(
        None, description="Run the imported model's baseline episodes once the checks pass (registration "
        "and requested probes only; health checks never do)."
    )


class ProbeCheck(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="url, load, sample_task, reset, tools, step, budget, demonstrations, "
                      "baseline or close.")
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
    baseline: ProbeBaseline | None = Field(None, description="The baseline the request asked for, when its "
                                           "episodes ran (the `baseline` check says why not otherwise).")

    @property
    def passed(self) -> bool:
        return all(check.status in ("passed", "warning") for check in self.checks)
