"""The trainer's side of the platform's trainer API (claim, heartbeat, telemetry, trajectory samples)."""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx
from pydantic import ValidationError

from tandem.configs.run import RunConfig
from tandem.contracts import (
    TRAINER_HEADER,
    CheckpointReport,
    DatasetRowsPage,
    EnvironmentSpec,
    EpisodeSpan,
    EvaluationReport,
    RunStatus,
    StepEpisodes,
    TelemetryReply,
    TrainerConflictCode,
    TrainerHeartbeat,
    TrainerHeartbeatReply,
    TrainerStepEvent,
    TrajectorySample,
)

logger = logging.getLogger(__name__)


class PlatformUnavailableError(RuntimeError):
    pass


class PlatformRequestFailedError(httpx.HTTPStatusError):
    """A request the platform answered with a server error on every try: it names the request's URL,
    the status and the platform's reason. The run it was for fails with this message, and the trainer
    goes on to the next run (a broken dataset version fails again however often it is asked)."""

    def __init__(self, method: str, response: httpx.Response, *, attempts: int):
        self.reason = (_error_of(response).get("message") or response.text.strip()[:300]
                       or response.reason_phrase)
        self.attempts = attempts
        super().__init__(f"the platform answered {method} {response.request.url} with HTTP "
                         f"{response.status_code} on all {attempts} tries: {self.reason}",
                         request=response.request, response=response)


class RunTakenOverError(RuntimeError):
    """The run is no longer this trainer's: the platform presumed it dead, and another trainer holds it or none does."""


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
    # The other environments its evaluations run on (config.evaluation.environments), in that order.
    evaluation_environments: tuple[EnvironmentSpec, ...] = ()
    # Times a trainer claimed the run, this claim included: past 1, resume from the checkpoint.
    attempt: int = 1
    # Unix time of the claim: the run's log lines of this claim are the ones from then on.
    claimed_at: float = field(default_factory=time.time)

    @property
    def is_resume(self) -> bool:
        return self.attempt > 1


# Backoff between retries: doubling from the first, up to the cap, each with up to 20% jitter so
# that the trainers of a restarted platform do not all come back in the same instant.
RETRY_FIRST_DELAY_S = 0.5
RETRY_MAX_DELAY_S = 30.0
# Answers worth asking again: the platform restarting, overloaded, or behind a proxy that lost it.
# These (and connection errors) are retried for as long as it takes ...
UNAVAILABLE_STATUS_CODES = frozenset({429, 502, 503, 504})
# ... and these a few times only: the same request failing on the server again and again is a
# bug to report, not an outage to wait out.
RETRIED_STATUS_CODES = UNAVAILABLE_STATUS_CODES | {500}
# How often a 500 is asked again (with the backoff: about 7 s in all) before the request fails;
# the trainer's operator setting TANDEM_TRAINER_SERVER_ERROR_RETRIES (trainer/main.py) changes it.
SERVER_ERROR_RETRIES = 4


def is_unavailable(exc: Exception) -> bool:
    """Whether ``exc`` (from a request out of retries) says the platform is away: worth waiting out."""
    if isinstance(exc, PlatformUnavailableError):
        return True
    return isinstance(exc, httpx.HTTPStatusError) and exc.response.status_code in UNAVAILABLE_STATUS_CODES


def is_retryable(exc: Exception) -> bool:
    """:func:`is_unavailable`, or a server error: worth trying again later, not at once."""
    return is_unavailable(exc) or (isinstance(exc, httpx.HTTPStatusError)
                                   and exc.response.status_code in RETRIED_STATUS_CODES)


def retry_delays(first_s: float = RETRY_FIRST_DELAY_S, cap_s: float = RETRY_MAX_DELAY_S):
    """The backoff's delays, without end."""
    delay = first_s
    while True:
        yield delay * random.uniform(0.8, 1.0)
        delay = min(delay * 2, cap_s)


class PlatformClient:
    """The trainer's HTTP client of the platform; every request names the trainer (``TRAINER_HEADER``).

    ``retries``: how often a request that met a connection error or a retried status is sent
    again, with backoff; None (the default) retries for as long as it takes, so that a platform
    that restarts, or that is still migrating when the trainer boots, never stops training.
    ``server_error_retries``: how often a 500 is sent again, whatever ``retries`` says: the
    same request failing on the server again and again is no outage to wait out.
    """

    def __init__(self, base_url: str, token: str, *, trainer_name: str, timeout_s: float = 10.0,
                 retries: int | None = None, server_error_retries: int = SERVER_ERROR_RETRIES):
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers={"Authorization": f"Token {token}", TRAINER_HEADER: trainer_name},
            timeout=timeout_s,
        )
        self.trainer_name = trainer_name
        self._retries = retries
        self._server_error_retries = server_error_retries
        # Telemetry bodies the platform refused as invalid (logged with their steps).
        self.refused_posts = 0
        # Series the platform left out of posts it stored otherwise (logged with their reasons).
        self.refused_series = 0

    def close(self) -> None:
        self._http.close()

    def _post(self, path: str, payload: dict, *, files: dict | None = None,
              retries: int | None | Literal["default"] = "default") -> httpx.Response:
        """POST, retried with backoff on connection trouble and on the statuses worth retrying.

        With ``files``, a multipart form: ``payload`` its fields, ``files`` name -> (filename, bytes).
        ``retries`` overrides the client's for this call. Out of retries, connection trouble raises
        :class:`PlatformUnavailableError` and an error status ``httpx.HTTPStatusError``.
        """
        retries = self._retries if retries == "default" else retries
        delays = retry_delays()
        attempt = 0
        while True:
            try:
                if files is None:
                    response = self._http.post(path, json=payload)
                else:
                    response = self._http.post(path, data=payload, files=files)
            except httpx.TransportError as exc:
                trouble: str = f"{type(exc).__name__}: {exc}"
                response = None
            else:
                if response.status_code not in RETRIED_STATUS_CODES:
                    _raise_for_status(response)
                    return response
                trouble = f"HTTP {response.status_code}"
                if response.status_code not in UNAVAILABLE_STATUS_CODES and attempt >= self._server_error_retries:
                    raise PlatformRequestFailedError("POST", response, attempts=attempt + 1)
            if retries is not None and attempt >= retries:
                if response is None:
                    raise PlatformUnavailableError(f"POST {path}: {trouble}")
                response.raise_for_status()
            delay = next(delays)
            # The first failure and then about one line a minute: a long outage must not flood the log.
            if attempt == 0 or attempt % 10 == 0:
                logger.warning("platform: POST %s failed (%s); retry %d in %.1fs", path, trouble, attempt + 1,
                               delay)
            attempt += 1
            time.sleep(delay)

    def _get(self, path: str, params: dict, *, between_retries: Callable[[], None] = lambda: None) -> httpx.Response:
        """GET, retried like :meth:`_post` (with the client's retries): a 500 ``server_error_retries``
        times at most, then :class:`PlatformRequestFailedError`.

        ``between_retries`` runs before each wait: the run's heartbeat, which raises when the run was
        cancelled or paused meanwhile, so that a request failing for good never outlives its run.
        """
        delays = retry_delays()
        attempt = 0
        while True:
            try:
                response = self._http.get(path, params=params)
            except httpx.TransportError as exc:
                trouble, response = f"{type(exc).__name__}: {exc}", None
            else:
                if response.status_code not in RETRIED_STATUS_CODES:
                    _raise_for_status(response)
                    return response
                trouble = f"HTTP {response.status_code}"
                if response.status_code not in UNAVAILABLE_STATUS_CODES and attempt >= self._server_error_retries:
                    raise PlatformRequestFailedError("GET", response, attempts=attempt + 1)
            if self._retries is not None and attempt >= self._retries:
                if response is None:
                    raise PlatformUnavailableError(f"GET {path}: {trouble}")
                response.raise_for_status()
            delay = next(delays)
            if attempt == 0 or attempt % 10 == 0:
                logger.warning("platform: GET %s failed (%s); retry %d in %.1fs", path, trouble, attempt + 1, delay)
            attempt += 1
            between_retries()
            time.sleep(delay)

    def dataset_rows(self, run_id: int, name: str, version: int, *, offset: int, limit: int,
                     between_retries: Callable[[], None] = lambda: None) -> DatasetRowsPage:
        """A page of the rows of dataset ``name@version``, which the run's config pins (sft.datasets);
        ``between_retries`` as :meth:`_get` runs it."""
        response = self._get(f"/api/trainer/runs/{run_id}/datasets/{name}/versions/{version}/rows/",
                             {"offset": offset, "limit": limit}, between_retries=between_retries)
        return DatasetRowsPage.model_validate(response.json())

    def claim(self, worker: str) -> ClaimedRun | None:
        response = self._post("/api/trainer/claim/", {"worker": worker})
        if response.status_code == 204:
            return None
        run = response.json()["run"]
        try:
            config = RunConfig.model_validate(run["config"])
            environment = EnvironmentSpec.model_validate(run["environment"])
            evaluation_environments = tuple(EnvironmentSpec.model_validate(spec)
                                            for spec in run.get("evaluation_environments", ()))
        except ValidationError as exc:
            # Claimed but unusable (say, a config stored before a rule it breaks): the run
            # fails with the reason, and the trainer goes on to the next one.
            raise UnusableClaimError(int(run["id"]), f"its config or environment is invalid: {exc}") from exc
        return ClaimedRun(
            run_id=int(run["id"]),
            name=run["name"],
            config=config,
            environment=environment,
            evaluation_environments=evaluation_environments,
            attempt=int(run.get("attempts", 1)),
        )

    def heartbeat(self, run_id: int, heartbeat: TrainerHeartbeat, *,
                  retries: int | None | Literal["default"] = "default") -> RunStatus:
        """Report progress; returns the run's status as the platform sees it (its TrainerHeartbeatReply's)."""
        response = self._post(f"/api/trainer/runs/{run_id}/heartbeat/", heartbeat.model_dump(mode="json"),
                              retries=retries)
        return TrainerHeartbeatReply.model_validate(response.json()).status

    def post_events(self, run_id: int, events: list[TrainerStepEvent], *,
                    retries: int | None | Literal["default"] = "default") -> TelemetryReply:
        """Post step events (none: only ask for the pending trace requests), in as many posts as they need.

        Posts stay under ``MAX_TELEMETRY_POST_BYTES`` and ``MAX_EVENTS_PER_POST``: the platform
        refuses larger bodies. A step whose episode spans alone are larger goes with the first
        of them, the rest following in :class:`StepEpisodes` chunks. Returns the last reply (the
        newest trace requests). A post of the same events again stores nothing twice.
        """
        reply = TelemetryReply(stored=0)
        for body in telemetry_posts(events):
            try:
                response = self._post(f"/api/trainer/runs/{run_id}/telemetry/", body, retries=retries)
            except httpx.HTTPStatusError as exc:
                if is_retryable(exc):
                    raise
                # Refused as invalid: posting it again would be refused again. The bodies after it
                # are still sent; what this one held is logged, never silently gone.
                steps = sorted({event["step"] for event in body["events"]}
                               | {chunk["step"] for chunk in body["episode_chunks"]})
                logger.error("run %s: the platform refused the telemetry of steps %s: %s", run_id,
                             steps, exc.response.text[:500])
                self.refused_posts += 1
                continue
            reply = TelemetryReply.model_validate(response.json())
            if reply.refused_series:
                # The rest of the post is stored; the platform counts these in telemetry/series_refused.
                self.refused_series += len(reply.refused_series)
                logger.warning("run %s: the platform refused %d series of its telemetry: %s", run_id,
                               len(reply.refused_series), "; ".join(
                                   f"{refused.name} at step {refused.step} ({refused.reason})"
                                   for refused in reply.refused_series[:5]))
        return reply

    def upload_trace(self, run_id: int, trace_id: int, *, first_step: int, last_step: int,
                     archive: Path | None, error: str = "") -> None:
        """Hand in a requested trace: the zipped trace directory, or why there is none."""
        fields = {"first_step": str(first_step), "last_step": str(last_step), "error": error}
        files = {"file": (archive.name, archive.read_bytes(), "application/zip")} if archive else {}
        # A few tries: it is sent from the training loop, which must not wait out an outage.
        self._post(f"/api/trainer/runs/{run_id}/traces/{trace_id}/", fields, files=files, retries=3)

    def post_trajectory_samples(self, run_id: int, samples: list[TrajectorySample], *,
                                timeout_s: float = 5.0) -> None:
        """Post samples once, without retrying: they are a view of training, never worth a wait."""
        if samples:
            response = self._http.post(
                f"/api/trainer/runs/{run_id}/trajectories/",
                json={"samples": [sample.model_dump(mode="json") for sample in samples]},
                timeout=timeout_s,
            )
            _raise_for_status(response)

    def post_evaluation(self, run_id: int, report: EvaluationReport, *, retries: int | None | Literal["default"] = 0
                        ) -> None:
        """Post an evaluation's results; the platform keeps one row per evaluation, so a repeat is harmless."""
        self._post(f"/api/trainer/runs/{run_id}/evaluations/", report.model_dump(mode="json"), retries=retries)

    def report_checkpoints(self, run_id: int, report: CheckpointReport, *, timeout_s: float = 5.0) -> None:
        """Post the run's committed checkpoints once, without retrying: the next commit posts them again."""
        response = self._http.post(f"/api/trainer/runs/{run_id}/checkpoints/",
                                   json=report.model_dump(mode="json"), timeout=timeout_s)
        _raise_for_status(response)


# The platform takes request bodies up to DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MiB by default) and
# 1000 events a post (platform/telemetry/views.py); the margin leaves room for the JSON around them.
MAX_TELEMETRY_POST_BYTES = 2 * 2**20
MAX_EVENTS_PER_POST = 1000


def telemetry_posts(events: list[TrainerStepEvent], *, max_bytes: int = MAX_TELEMETRY_POST_BYTES,
                    max_events: int = MAX_EVENTS_PER_POST) -> list[dict]:
    """The telemetry bodies that carry ``events``, each at most ``max_bytes`` of JSON; one empty body if none.

    Events go in order. An event too large for a post of its own is cut: it carries the
    episodes that fit, with ``episodes_total`` set, and its other episodes follow in
    ``episode_chunks`` (:class:`StepEpisodes`), in the posts after it.
    """
    bodies: list[dict] = []
    events_json: list[str] = []
    chunks_json: list[str] = []
    size = 0

    def close() -> None:
        nonlocal size
        if events_json or chunks_json:
            bodies.append({"events": [json.loads(text) for text in events_json],
                           "episode_chunks": [json.loads(text) for text in chunks_json]})
        events_json.clear()
        chunks_json.clear()
        size = 0

    def add(text: str, into: list[str]) -> None:
        nonlocal size
        length = _wire_bytes(text)
        if size + length + 64 > max_bytes or len(events_json) + len(chunks_json) >= max_events:
            close()
        into.append(text)
        size += length + 1

    for event in events:
        if event.timeline is None and event.episodes:
            # The platform keeps episodes only for the timeline of a step it can draw.
            event = event.model_copy(update={"episodes": []})
        text = event.model_dump_json()
        if _wire_bytes(text) + 64 <= max_bytes:
            add(text, events_json)
            continue
        episodes = event.episodes
        head = _with_episodes_that_fit(event.model_copy(update={"episodes": []}), episodes, max_bytes)
        add(head.model_dump_json(), events_json)
        offset = len(head.episodes)
        while offset < len(episodes):
            chunk, offset = _episode_chunk(event, episodes, offset, max_bytes)
            add(chunk.model_dump_json(), chunks_json)
    close()
    return bodies or [{"events": [], "episode_chunks": []}]


def _with_episodes_that_fit(bare: TrainerStepEvent, episodes: list[EpisodeSpan], max_bytes: int) -> TrainerStepEvent:
    """``bare`` with as many of ``episodes`` as fit in half a post, and ``episodes_total`` set."""
    count = _count_that_fit(episodes, 0, max_bytes // 2 - _wire_bytes(bare.model_dump_json()))
    return bare.model_copy(update={"episodes": episodes[:count], "episodes_total": len(episodes)})


def _episode_chunk(event: TrainerStepEvent, episodes: list[EpisodeSpan], offset: int,
                   max_bytes: int) -> tuple[StepEpisodes, int]:
    """The chunk of ``episodes`` from ``offset`` that fits in half a post, and the offset after it."""
    count = max(_count_that_fit(episodes, offset, max_bytes // 2 - 200), 1)
    chunk = StepEpisodes(run_id=event.run_id, step=event.step, offset=offset,
                         episodes=episodes[offset:offset + count])
    return chunk, offset + count


def _count_that_fit(episodes: list[EpisodeSpan], offset: int, budget: int) -> int:
    count, used = 0, 0
    for episode in episodes[offset:]:
        used += _wire_bytes(episode.model_dump_json()) + 1
        if used > budget:
            break
        count += 1
    return count


def _wire_bytes(text: str) -> int:
    """The bytes ``text`` (pydantic's JSON) takes on the wire: httpx sends UTF-8, not ASCII escapes."""
    return len(text.encode())


# Conflicts that mean the run is no longer this trainer's: another trainer holds it (this one
# was presumed dead and the run resumed elsewhere), or none does (the reaper queued it again).
RUN_LOST_CODES = frozenset({TrainerConflictCode.RUN_HELD_BY_ANOTHER_TRAINER, TrainerConflictCode.RUN_NOT_CLAIMED})


def _raise_for_status(response: httpx.Response) -> None:
    """``raise_for_status``, with the conflicts of a run this trainer lost raised as :class:`RunTakenOverError`."""
    if response.status_code == 409:
        error = _error_of(response)
        if error.get("code") in RUN_LOST_CODES:
            raise RunTakenOverError(error.get("message", ""))
    response.raise_for_status()


def _error_of(response: httpx.Response) -> dict:
    """The platform's ``{"error": {"code", "message", "fields"}}`` of a refused request; {} if it has none."""
    try:
        body = response.json()
    except ValueError:
        return {}
    error = body.get("error") if isinstance(body, dict) else None
    return error if isinstance(error, dict) else {}
