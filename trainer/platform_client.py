"""The trainer's side of the platform's trainer API (claim, heartbeat, telemetry, trajectory samples)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from pydantic import ValidationError

from tandem.contracts import (
    CheckpointReport,
    EnvironmentSpec,
    RunStatus,
    TelemetryReply,
    TrainerConflictCode,
    TrainerHeartbeat,
    TrainerHeartbeatReply,
    TrainerStepEvent,
    TrajectorySample,
)
from tandem.run_config import RunConfig

logger = logging.getLogger(__name__)


class PlatformUnavailableError(RuntimeError):
    pass


class RunTakenOverError(RuntimeError):
    """The platform gave this trainer's run to another trainer (it presumed this one dead)."""


class UnusableClaimError(Exception):
    """A run this trainer claimed cannot be trained as it is stored."""

    def __init__(self, run_id: int, reason: str):
        super().__init__(reason)
        self.run_id = run_id
        self.reason = reason


@dataclass(frozen=True)
class ClaimedRun:
    run_id: int
    name: str
    config: RunConfig  # validated once, here
    environment: EnvironmentSpec
    # Times a trainer claimed the run, this claim included: past 1, resume from the checkpoint.
    attempt: int = 1

    @property
    def is_resume(self) -> bool:
        return self.attempt > 1


class PlatformClient:
    def __init__(self, base_url: str, token: str, *, timeout_s: float = 10.0, retries: int = 5):
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Token {token}"},
            timeout=timeout_s,
        )
        self._retries = retries

    def close(self) -> None:
        self._http.close()

    def _post(self, path: str, payload: dict, *, files: dict | None = None) -> httpx.Response:
        """POST with retries on connection trouble, so a platform restart does not kill training.

        With ``files``, a multipart form: ``payload`` its fields, ``files`` name -> (filename, bytes).
        """
        delay = 0.5
        for attempt in range(self._retries + 1):
            try:
                if files is None:
                    response = self._http.post(path, json=payload)
                else:
                    response = self._http.post(path, data=payload, files=files)
            except httpx.TransportError as exc:
                if attempt == self._retries:
                    raise PlatformUnavailableError(f"POST {path}: {exc}") from exc
                logger.warning("platform unreachable (%s); retrying in %.1fs", exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            if response.status_code >= 500 and attempt < self._retries:
                time.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            response.raise_for_status()
            return response
        raise AssertionError("unreachable")

    def claim(self, worker: str) -> ClaimedRun | None:
        response = self._post("/api/trainer/claim/", {"worker": worker})
        if response.status_code == 204:
            return None
        run = response.json()["run"]
        try:
            config = RunConfig.model_validate(run["config"])
            environment = EnvironmentSpec.model_validate(run["environment"])
        except ValidationError as exc:
            # Claimed but unusable (say, a config stored before a rule it breaks): the run
            # fails with the reason, and the trainer goes on to the next one.
            raise UnusableClaimError(int(run["id"]), f"its config or environment is invalid: {exc}") from exc
        return ClaimedRun(
            run_id=int(run["id"]),
            name=run["name"],
            config=config,
            environment=environment,
            attempt=int(run.get("attempts", 1)),
        )

    def heartbeat(self, run_id: int, heartbeat: TrainerHeartbeat) -> RunStatus:
        """Report progress; returns the run's status as the platform sees it (its TrainerHeartbeatReply's)."""
        try:
            response = self._post(f"/api/trainer/runs/{run_id}/heartbeat/", heartbeat.model_dump(mode="json"))
        except httpx.HTTPStatusError as exc:
            error = _error_of(exc.response)
            if error.get("code") == TrainerConflictCode.RUN_HELD_BY_ANOTHER_TRAINER:
                raise RunTakenOverError(error.get("message", "")) from exc
            raise
        return TrainerHeartbeatReply.model_validate(response.json()).status

    def post_events(self, run_id: int, events: list[TrainerStepEvent]) -> TelemetryReply:
        """Post step events (none: only ask for the pending trace requests)."""
        response = self._post(
            f"/api/trainer/runs/{run_id}/telemetry/",
            {"events": [event.model_dump(mode="json") for event in events]},
        )
        return TelemetryReply.model_validate(response.json())

    def upload_trace(self, run_id: int, trace_id: int, *, first_step: int, last_step: int,
                     archive: Path | None, error: str = "") -> None:
        """Hand in a requested trace: the zipped trace directory, or why there is none."""
        fields = {"first_step": str(first_step), "last_step": str(last_step), "error": error}
        files = {"file": (archive.name, archive.read_bytes(), "application/zip")} if archive else {}
        self._post(f"/api/trainer/runs/{run_id}/traces/{trace_id}/", fields, files=files)

    def post_trajectory_samples(self, run_id: int, samples: list[TrajectorySample], *,
                                timeout_s: float = 5.0) -> None:
        """Post samples once, without retrying: they are a view of training, never worth a wait."""
        if samples:
            response = self._http.post(
                f"/api/trainer/runs/{run_id}/trajectories/",
                json={"samples": [sample.model_dump(mode="json") for sample in samples]},
                timeout=timeout_s,
            )
            response.raise_for_status()

    def report_checkpoints(self, run_id: int, report: CheckpointReport, *, timeout_s: float = 5.0) -> None:
        """Post the run's committed checkpoints once, without retrying: the next commit posts them again."""
        response = self._http.post(f"/api/trainer/runs/{run_id}/checkpoints/",
                                   json=report.model_dump(mode="json"), timeout=timeout_s)
        response.raise_for_status()


def _error_of(response: httpx.Response) -> dict:
    """The platform's ``{"error": {"code", "message", "fields"}}`` of a refused request; {} if it has none."""
    try:
        body = response.json()
    except ValueError:
        return {}
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, dict) else {}
