"""A Python client of the Tandem platform's REST and WebSocket API.

```
from tandem.sdk.client import TandemClient

with TandemClient("http://127.0.0.1:8000", token="...") as tandem:
    run = tandem.runs.create(environment="calculator", config={"rl_steps": 20})
    for step in tandem.runs.stream_metrics(run.id):
        print(step.step, step.values.get("reward_mean"))
    print(tandem.runs.wait(run.id, timeout=600).status)
```

Every error the platform answers is raised as :class:`TandemAPIError`, which
carries the API's one error shape (``code``, ``message``, ``fields``). Lists
are iterated page by page behind the caller's back.

Streaming follows the run page's pattern: history comes over REST from a step
cursor, the WebSocket only tells us about new steps and may drop messages, so
after every (re)connect, after a gap in the steps and at the run's end the
client backfills from the cursor again. No step is lost or yielded twice.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict

from tandem.configs.changes import merge_changes
from tandem.contracts import TERMINAL_RUN_STATUSES, ErrorCode

METRICS_PAGE_LIMIT = 5000  # the platform's maximum points per page


class TandemAPIError(Exception):
    """An error answer of the platform: ``{"error": {"code", "message", "fields"}}``.

    ``fields`` maps a dotted field path (``config.rollout.group_size``) to its messages.
    Answers that are not in that shape (a proxy's 502, a missing route) get the
    code ``http_<status>`` and the start of the body as the message.
    """

    def __init__(self, *, status_code: int, code: str, message: str,
                 fields: dict[str, list[str]] | None = None):
        self.status_code = status_code
        self.code = code
        self.message = message
        self.fields = fields or {}
        super().__init__(f"{status_code} {code}: {message}")

    @classmethod
    def from_response(cls, response: httpx.Response) -> TandemAPIError:
        try:
            body = response.json()
        except ValueError:
            body = None
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict) and "code" in error:
            return cls(status_code=response.status_code, code=str(error["code"]),
                       message=str(error.get("message", "")), fields=error.get("fields") or {})
        text = response.text.strip().splitlines()[0][:200] if response.text.strip() else ""
        return cls(status_code=response.status_code, code=f"http_{response.status_code}",
                   message=text or response.reason_phrase)

    @property
    def is_platform_error(self) -> bool:
        """True when the platform itself answered in its error shape (not a proxy or a missing route)."""
        return not self.code.startswith("http_")


class EndpointUnavailable(TandemAPIError):
    """The platform has no such endpoint (an older platform than this client)."""


class RunWaitTimeout(TimeoutError):
    def __init__(self, run: Run, timeout: float):
        self.run = run
        super().__init__(f"run {run.id} is still {run.status} after {timeout:g}s")


class _Record(BaseModel):
    # Fields the platform adds later stay readable as attributes instead of failing validation.
    model_config = ConfigDict(extra="allow")


class Project(_Record):
    id: int
    name: str
    role: str | None = None


class Environment(_Record):
    """An environment of a project with its newest registered version (kind, settings, tools, status)."""

    id: int
    project: int | None = None
    name: str
    latest_version: dict[str, Any] | None = None

    @property
    def kind(self) -> str:
        return (self.latest_version or {}).get("kind", "")

    @property
    def settings(self) -> dict[str, Any]:
        return (self.latest_version or {}).get("settings", {})

    @property
    def secret_setting_names(self) -> list[str]:
        """Names of the write-only ``secret_settings`` (pass them to ``register``); never their values."""
        return (self.latest_version or {}).get("secret_setting_names", [])


class Dataset(_Record):
    """An SFT dataset of a project with its newest version (number, row_count, size_bytes, sha256 ...)."""

    id: int
    project: int | None = None
    name: str
    latest_version: dict[str, Any] | None = None
    versions: list[dict[str, Any]] | None = None  # in the answers that carry them, newest first

    @property
    def version(self) -> int | None:
        """The newest version's number."""
        return (self.latest_version or {}).get("number")

    @property
    def row_count(self) -> int:
        return (self.latest_version or {}).get("row_count", 0)


class Run(_Record):
    id: int
    project: int
    name: str
    environment: str
    # A RunStatus; kept a str, so that a newer platform's status does not break an older client.
    status: str
    status_reason: str = ""
    config: dict[str, Any]
    policy_version: int = 0
    trainer_step: int = 0
    attempts: int = 0
    heartbeat_at: str | None = None
    created_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    tags: list[str] = []
    notes: str = ""
    urls: dict[str, str] = {}

    @property
    def ended(self) -> bool:
        return self.status in TERMINAL_RUN_STATUSES

    @property
    def total_steps(self) -> int:
        """Trainer steps of the whole run: SFT then RL, counted together like ``trainer_step``."""
        return int(self.config.get("sft_steps", 0)) + int(self.config.get("rl_steps", 0))


class Evaluation(_Record):
    """One held-out evaluation of a run's policy version (tandem.contracts.EvaluationReport, as stored)."""

    index: int
    step: int
    policy_version: int
    environment: str
    status: str
    reason: str = ""
    tasks: int
    samples_per_task: int
    temperature: float
    episodes: int
    metrics: dict[str, float]
    intervals: dict[str, list[float]] = {}
    trajectory_ids: list[str] = []


class EvaluationProgress(_Record):
    """How far one evaluation of a run has come, as its trainer keeps it (tandem.contracts.EvaluationProgress)."""

    evaluation: int
    policy_version: int
    episodes_expected: int
    episodes_received: int
    # running until its report is made, then the report's status (complete or incomplete).
    status: str

    @property
    def fraction(self) -> float:
        """Of the episodes expected, the share received (1 when none were expected)."""
        if not self.episodes_expected:
            return 1.0
        return min(self.episodes_received / self.episodes_expected, 1.0)


class MetricPoint(_Record):
    step: int
    name: str
    value: float | None


class StepMetrics(BaseModel):
    """The values of one trainer step (``loss``, ``reward_mean``, ``success_rate`` ...)."""

    step: int
    values: dict[str, float | None]


class MetricsPage(BaseModel):
    run: int
    points: list[MetricPoint]
    next_after_step: int | None  # None on an empty page: nothing after the cursor yet


class RunProgress(BaseModel):
    """What :meth:`RunsAPI.poll_progress` yields: the run as a progress line shows it."""

    run: Run
    step: int | None = None  # the newest step with recorded metrics; None before the first
    latest: dict[str, float | None] = {}  # each metric's newest value
    # False: the platform did not answer this poll (restarting?); run, step and latest are the last known.
    reachable: bool = True


class RunEvent(BaseModel):
    """What :meth:`RunsAPI.follow` yields: a step's metrics, or the run's new state."""

    kind: str  # "metrics" or "status"
    run: Run | None = None
    metrics: StepMetrics | None = None


def _steps_of(points: list[MetricPoint]) -> list[StepMetrics]:
    steps: list[StepMetrics] = []
    for point in points:
        if not steps or steps[-1].step != point.step:
            steps.append(StepMetrics(step=point.step, values={}))
        steps[-1].values[point.name] = point.value
    return steps


class _Transport:
    """One ``httpx.Client``: the token, error mapping and pagination."""

    def __init__(self, base_url: str, token: str, *, timeout: float):
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.http = httpx.Client(base_url=self.base_url, timeout=timeout,
                                 headers={"Authorization": f"Token {token}", "Accept": "application/json"})

    def request(self, method: str, path: str, *, missing_route_is_unavailable: bool = False,
                **kwargs) -> Any:
        response = self.http.request(method, path, **kwargs)
        if response.status_code >= 400:
            error = TandemAPIError.from_response(response)
            if missing_route_is_unavailable and response.status_code in (404, 405) and not error.is_platform_error:
                raise EndpointUnavailable(status_code=response.status_code, code="endpoint_unavailable",
                                          message=f"the platform at {self.base_url} has no {method} {path}")
            raise error
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    def paginate(self, path: str, params: dict[str, Any] | None = None) -> Iterator[dict]:
        """Every item of a paginated list, following ``next`` page by page."""
        url: str | None = path
        query: dict | None = {key: value for key, value in (params or {}).items() if value is not None}
        while url:
            page = self.request("GET", url, params=query)
            yield from page["results"]
            url = page.get("next")
            query = None  # ``next`` carries the query (even empty params would replace it)

    def websocket_url(self, path: str) -> str:
        scheme, _, rest = self.base_url.partition("://")
        return f"{'wss' if scheme == 'https' else 'ws'}://{rest}{path}"


class ProjectsAPI:
    def __init__(self, transport: _Transport):
        self._transport = transport

    def list(self) -> Iterator[Project]:
        for item in self._transport.paginate("/api/projects/"):
            yield Project.model_validate(item)

    def create(self, name: str) -> Project:
        return Project.model_validate(self._transport.request("POST", "/api/projects/", json={"name": name}))


class EnvironmentsAPI:
    """Environments of the caller's projects.

    Thin on purpose: ``register`` forwards any extra registration field as it
    is, so fields a newer platform accepts need no client change.
    """

    def __init__(self, transport: _Transport):
        self._transport = transport

    def list(self, *, project: int | None = None) -> Iterator[Environment]:
        for item in self._transport.paginate("/api/environments/", {"project": project}):
            yield Environment.model_validate(item)

    def get(self, name: str, *, project: int | None = None) -> Environment:
        for environment in self.list(project=project):
            if environment.name == name:
                return environment
        raise TandemAPIError(status_code=404, code=ErrorCode.NOT_FOUND,
                             message=f"No environment named {name!r} in your projects.",
                             fields={"name": [f"No environment named {name!r}."]})

    def register(self, name: str, *, entrypoint: str | None = None, kind: str | None = None,
                 settings: dict[str, Any] | None = None, tools: list[dict[str, Any]] | None = None,
                 project: int | None = None, **fields: Any) -> Environment:
        """Register ``name`` (version 1); the platform probes it on a worker before runs may use it."""
        body = {"name": name, "entrypoint": entrypoint, "kind": kind, "settings": settings, "tools": tools,
                "project": project, **fields}
        body = {key: value for key, value in body.items() if value is not None}
        return Environment.model_validate(self._transport.request("POST", "/api/environments/", json=body))

    def probe(self, name: str, *, project: int | None = None, wait_s: float = 60.0,
              poll_s: float = 0.5, baseline: dict[str, Any] | None = None) -> dict[str, Any]:
        """Probe the newest version of ``name`` again and return the probe: ``status`` and its ``checks``.

        ``baseline`` (``{"model": "<imported model directory>", "episodes": 8}``): the probe then plays
        that many held-out episodes of the model and reports its tool-call rate under ``baseline``.

        Waits up to ``wait_s`` for a worker to run it; a probe still ``pending``
        after that is returned as it is. Raises :class:`EndpointUnavailable`
        when the platform has no probe endpoint.
        """
        environment = self.get(name, project=project)
        if not environment.latest_version:
            raise TandemAPIError(status_code=409, code=ErrorCode.CONFLICT, message=f"{name!r} has no version to probe.",
                                 fields={})
        version_path = f"/api/environments/{environment.id}/versions/{environment.latest_version['number']}/"
        probe = self._transport.request("POST", f"{version_path}probe/", missing_route_is_unavailable=True,
                                        json={"baseline": baseline} if baseline is not None else None)
        deadline = time.monotonic() + wait_s
        while probe["status"] == "pending" and time.monotonic() < deadline:
            time.sleep(poll_s)
            probes = self._transport.request("GET", version_path)["probes"]
            probe = next((item for item in probes if item["id"] == probe["id"]), probe)
        return probe


class DatasetsAPI:
    """SFT datasets of the caller's projects: JSONL files of chat conversations, in immutable versions."""

    def __init__(self, transport: _Transport):
        self._transport = transport

    def list(self, *, project: int | None = None) -> Iterator[Dataset]:
        for item in self._transport.paginate("/api/datasets/", {"project": project}):
            yield Dataset.model_validate(item)

    def get(self, name: str, *, project: int | None = None) -> Dataset:
        for dataset in self.list(project=project):
            if dataset.name == name:
                return Dataset.model_validate(self._transport.request("GET", f"/api/datasets/{dataset.id}/"))
        raise TandemAPIError(status_code=404, code=ErrorCode.NOT_FOUND,
                             message=f"No dataset named {name!r} in your projects.",
                             fields={"name": [f"No dataset named {name!r}."]})

    def register(self, name: str, file: str | os.PathLike | None = None, *, path: str | None = None,
                 project: int | None = None, wait: bool = True, timeout: float | None = 1800.0,
                 poll_interval_s: float = 0.5) -> Dataset:
        """Upload the JSONL ``file`` (streamed) as the next version of ``name`` (1 for a new name).

        Or ``path``: a file on the platform's host, under its operator's dataset roots.
        A file with any bad row stores nothing; the error's ``fields["file"]`` names each
        bad line and field (``line 17: messages.2.role: ...``). The platform answers once
        the file is checked; its datasets worker then stores the rows. With ``wait``
        (the default) this returns when the version is ``ready``, and raises a
        TandemAPIError (code ``conflict``) if storing failed; without, at once, with
        ``latest_version["status"]`` ``pending`` (:meth:`wait_ready` waits later).
        """
        if (file is None) == (path is None):
            raise ValueError("give either file (to upload) or path (on the platform's host)")
        fields = {"name": name, **({"project": str(project)} if project is not None else {})}
        if path is not None:
            body = self._transport.request("POST", "/api/datasets/", json={**fields, "path": path,
                                                                           "project": project})
        else:
            with open(file, "rb") as handle:
                body = self._transport.request("POST", "/api/datasets/", data=fields,
                                               files={"file": (Path(file).name, handle, "application/jsonl")})
        dataset = Dataset.model_validate(body)
        if not wait:
            return dataset
        return self.wait_ready(dataset.id, dataset.version, timeout=timeout, poll_interval_s=poll_interval_s)

    def wait_ready(self, dataset_id: int, number: int, *, timeout: float | None = 1800.0,
                   poll_interval_s: float = 0.5) -> Dataset:
        """Wait until version ``number`` of dataset ``dataset_id`` has all its rows stored; the dataset then.

        Raises:
          TandemAPIError: code ``conflict``, with the platform's reason, if storing failed;
            TimeoutError past ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            version = self._transport.request("GET", f"/api/datasets/{dataset_id}/versions/{number}/")
            if version["status"] == "ready":
                return Dataset.model_validate(self._transport.request("GET", f"/api/datasets/{dataset_id}/"))
            if version["status"] == "failed":
                raise TandemAPIError(status_code=409, code=ErrorCode.CONFLICT, message=version["failure_reason"],
                                     fields={"file": [version["failure_reason"]]})
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"dataset {dataset_id} version {number} is still {version['status']} "
                                   f"({version['rows_stored']} of {version['row_count']} rows) after {timeout:g}s")
            time.sleep(poll_interval_s)

    def rows(self, name: str, *, version: int | None = None, project: int | None = None,
             page_size: int = 500) -> Iterator[dict[str, Any]]:
        """The rows of version ``version`` (default: the newest) of ``name``, in file order."""
        dataset = self.get(name, project=project)
        number = version or dataset.version
        offset = 0
        while True:
            page = self._transport.request("GET", f"/api/datasets/{dataset.id}/versions/{number}/rows/",
                                           params={"offset": offset, "limit": page_size})
            yield from page["rows"]
            offset += len(page["rows"])
            if not page["rows"] or offset >= page["total"]:
                return


class RunsAPI:
    def __init__(self, transport: _Transport):
        self._transport = transport

    def create(self, *, environment: str, config: dict[str, Any] | None = None, name: str = "",
               project: int | None = None) -> Run:
        """Queue a run. ``config`` is a partial RunConfig; the platform's defaults fill the rest."""
        body: dict[str, Any] = {"environment": environment, "config": config or {}, "name": name}
        if project is not None:
            body["project"] = project
        return Run.model_validate(self._transport.request("POST", "/api/runs/", json=body))

    def list(self, *, status: str | None = None, page_size: int | None = None) -> Iterator[Run]:
        """The caller's runs, newest first, fetched one page at a time as the caller iterates."""
        for item in self._transport.paginate("/api/runs/", {"status": status, "page_size": page_size}):
            yield Run.model_validate(item)

    def get(self, run_id: int) -> Run:
        return Run.model_validate(self._transport.request("GET", f"/api/runs/{run_id}/"))

    def cancel(self, run_id: int) -> Run:
        return Run.model_validate(self._transport.request("POST", f"/api/runs/{run_id}/cancel/"))

    def pause(self, run_id: int) -> Run:
        return Run.model_validate(self._transport.request("POST", f"/api/runs/{run_id}/pause/"))

    def resume(self, run_id: int) -> Run:
        return Run.model_validate(self._transport.request("POST", f"/api/runs/{run_id}/resume/"))

    def annotate(self, run_id: int, *, tags: list[str] | None = None, notes: str | None = None) -> Run:
        """Replace the run's tags (what the workspace searches and groups by), its notes, or both."""
        body = {key: value for key, value in (("tags", tags), ("notes", notes)) if value is not None}
        return Run.model_validate(self._transport.request("PATCH", f"/api/runs/{run_id}/", json=body))

    def clone(self, run_id: int, *, config: dict[str, Any] | None = None, name: str = "") -> Run:
        """A new queued run with ``config`` (only the changes) merged key by key into the original's."""
        body = {"config": config or {}, "name": name}
        return Run.model_validate(self._transport.request("POST", f"/api/runs/{run_id}/clone/", json=body))

    def evaluate(self, run_id: int, *, step: int | None = None, evaluation: dict[str, Any] | None = None,
                 name: str = "") -> Run:
        """An evaluation-only run of the run's kept checkpoint ``step`` (None: the newest): no training.

        ``evaluation``: the config's evaluation section (None: the run's own, or the defaults).
        """
        body = {"step": step, "evaluation": evaluation, "name": name}
        return Run.model_validate(self._transport.request("POST", f"/api/runs/{run_id}/evaluate/", json=body))

    def evaluate_model(self, model_dir: str | os.PathLike, *, environment: str,
                       evaluation: dict[str, Any] | None = None, config: dict[str, Any] | None = None,
                       project: int | None = None, name: str = "") -> Run:
        """An evaluation-only run of the Hugging Face model in ``model_dir``, as it is: evaluated once, no training.

        ``model_dir`` is a directory on the platform's hosts, under one of the operator's
        TANDEM_MODEL_ROOTS (``tandem models import`` puts models there); it is both the
        checkpoint and the tokenizer. ``environment``: a name, or ``name@version``.
        ``evaluation``: the config's evaluation section (None: the defaults). ``config``: any
        other run config values (``{"sampling": {"max_new_tokens": 48}}``), merged key by key.
        """
        directory = str(model_dir)
        evaluation_only = {"model": {"hf_checkpoint": directory, "tokenizer": directory},
                           "sft_steps": 0, "rl_steps": 0, "evaluation": evaluation or {}}
        return self.create(environment=environment, config=merge_changes(config or {}, evaluation_only),
                           name=name or f"evaluation of {Path(directory).name}"[:200], project=project)

    def wait(self, run_id: int, timeout: float | None = None, *, poll_interval_s: float = 1.0) -> Run:
        """Block until the run has ended (finished, failed or cancelled); :class:`RunWaitTimeout` otherwise."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            run = self.get(run_id)
            if run.ended:
                return run
            if deadline is not None and time.monotonic() >= deadline:
                raise RunWaitTimeout(run, timeout)
            pause = poll_interval_s if deadline is None else min(poll_interval_s, deadline - time.monotonic())
            time.sleep(max(pause, 0.0))

    def metrics_page(self, run_id: int, *, after_step: int = -1, names: list[str] | None = None,
                     limit: int = METRICS_PAGE_LIMIT) -> MetricsPage:
        params: dict[str, Any] = {"after_step": after_step, "limit": limit}
        if names:
            params["names"] = ",".join(names)
        return MetricsPage.model_validate(
            self._transport.request("GET", f"/api/runs/{run_id}/metrics/", params=params))

    def poll_progress(self, run_id: int, *, poll_interval_s: float = 1.0,
                      recent_steps: int = 5) -> Iterator[RunProgress]:
        """The run's progress, polled over REST: yielded after every poll, changed or not, so that a
        caller's loop runs once a poll; ends after the poll that found the run ended.

        The metrics start ``recent_steps`` before the run's current step, then follow it. A
        platform that does not answer a poll (a web server restarting) is asked again at the next;
        meanwhile the last known progress is yielded with ``reachable`` False. The first poll's
        failure is raised: there is nothing to show yet.
        """
        run = self.get(run_id)
        cursor = max(run.trainer_step - recent_steps, -1)
        step: int | None = None
        latest: dict[str, float | None] = {}
        while True:
            reachable = True
            try:
                run = self.get(run_id)
                # Step by step, so that a poll cut short keeps what it read.
                for metrics, next_cursor in self._drain(run_id, names=None, after_step=cursor):
                    step, cursor = metrics.step, next_cursor
                    latest.update(metrics.values)
            except httpx.TransportError:
                reachable = False
            yield RunProgress(run=run, step=step, latest=dict(latest), reachable=reachable)
            if reachable and run.ended:
                return
            time.sleep(poll_interval_s)

    def evaluations(self, run_id: int) -> list[Evaluation]:
        """The run's held-out evaluations, in the order they were asked for."""
        return [Evaluation.model_validate(item)
                for item in self._transport.paginate(f"/api/runs/{run_id}/evaluations/")]

    def evaluation_progress(self, run_id: int) -> list[EvaluationProgress] | None:
        """How far each evaluation the run's trainer asked for has come, first one first.

        None when the platform could not read it (its Redis is away). Raises
        :class:`EndpointUnavailable` from a platform older than this client.
        """
        body = self._transport.request("GET", f"/api/runs/{run_id}/evaluations/progress/",
                                       missing_route_is_unavailable=True)
        if body["evaluations"] is None:
            return None
        return [EvaluationProgress.model_validate(item) for item in body["evaluations"]]

    def trajectories(self, run_id: int, *, status: str | None = None, environment: str | None = None,
                     min_reward: float | None = None, max_reward: float | None = None,
                     page_size: int | None = None) -> Iterator[dict[str, Any]]:
        """The run's sampled trajectories, newest step first, without their turns (one page at a time)."""
        params = {"status": status, "environment": environment, "min_reward": min_reward,
                  "max_reward": max_reward, "page_size": page_size}
        yield from self._transport.paginate(f"/api/runs/{run_id}/trajectories/", params)

    def trajectory(self, run_id: int, trajectory_id: str) -> dict[str, Any]:
        """One sampled trajectory: reward, status, policy versions and its turns with trained/masked spans."""
        return self._transport.request("GET", f"/api/runs/{run_id}/trajectories/{trajectory_id}/")

    def metrics(self, run_id: int, names: list[str] | None = None, after_step: int = -1) -> Iterator[StepMetrics]:
        """Every recorded step after ``after_step``, in step order, drained page by page."""
        for step, _cursor in self._drain(run_id, names=names, after_step=after_step):
            yield step

    def _drain(self, run_id: int, *, names: list[str] | None, after_step: int) -> Iterator[tuple[StepMetrics, int]]:
        # Pages hold whole steps only, so a step never straddles two pages.
        cursor = after_step
        while True:
            page = self.metrics_page(run_id, after_step=cursor, names=names)
            if not page.points:
                return
            for step in _steps_of(page.points):
                yield step, page.next_after_step
            cursor = page.next_after_step

    def stream_metrics(self, run_id: int, names: list[str] | None = None, *, after_step: int = -1,
                       until_ended: bool = True, idle_check_s: float = 5.0,
                       reconnect_max_s: float = 10.0) -> Iterator[StepMetrics]:
        """Each step after ``after_step``, once and in increasing step order: recorded ones, then live ones.

        Ends once the run has ended and its last step was yielded (or never,
        with ``until_ended=False``, until the caller stops iterating).
        """
        for event in self.follow(run_id, names=names, after_step=after_step, until_ended=until_ended,
                                 idle_check_s=idle_check_s, reconnect_max_s=reconnect_max_s):
            if event.metrics is not None:
                yield event.metrics

    def follow(self, run_id: int, names: list[str] | None = None, *, after_step: int = -1,
               until_ended: bool = True, idle_check_s: float = 5.0,
               reconnect_max_s: float = 10.0) -> Iterator[RunEvent]:
        """Like :meth:`stream_metrics`, and also yields the run each time its state is learnt anew.

        ``status`` events carry the run (its ``status``, ``policy_version`` and
        ``trainer_step``); what progress bars need besides the metrics.
        """
        from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
        from websockets.sync.client import connect

        wanted = set(names or ())
        last_yielded = after_step  # highest step yielded; steps only ever go up
        rest_cursor = after_step  # where REST backfill resumes

        def backfill() -> Iterator[RunEvent]:
            nonlocal last_yielded, rest_cursor
            for step, cursor in self._drain(run_id, names=names, after_step=rest_cursor):
                rest_cursor = cursor
                if step.step > last_yielded:
                    last_yielded = step.step
                    yield RunEvent(kind="metrics", metrics=step)

        run = self.get(run_id)
        yield RunEvent(kind="status", run=run)
        yield from backfill()
        if run.ended and until_ended:
            return

        retry_s = 0.5
        headers = {"Authorization": f"Token {self._transport.token}"}
        url = self._transport.websocket_url(f"/ws/runs/{run_id}/")
        while True:
            try:
                socket = connect(url, additional_headers=headers, open_timeout=10)
            except InvalidStatus as exc:
                if exc.response.status_code in (401, 403, 404):
                    raise TandemAPIError(status_code=exc.response.status_code, code="websocket_refused",
                                         message=f"the platform refused the WebSocket of run {run_id}") from exc
                socket = None
            except (OSError, InvalidHandshake, TimeoutError):
                socket = None
            if socket is None:
                time.sleep(retry_s)
                retry_s = min(retry_s * 2, reconnect_max_s)
                continue
            retry_s = 0.5
            with socket:
                try:
                    # Subscribed now: catch up on whatever happened while we were not.
                    run = self.get(run_id)
                    yield RunEvent(kind="status", run=run)
                    yield from backfill()
                    if run.ended and until_ended:
                        return
                    while True:
                        try:
                            message = json.loads(socket.recv(timeout=idle_check_s))
                        except TimeoutError:
                            # A quiet socket may have dropped the run's end: ask REST.
                            run = self.get(run_id)
                            yield RunEvent(kind="status", run=run)
                            yield from backfill()
                            if run.ended and until_ended:
                                return
                            continue
                        if message.get("type") == "metrics":
                            step = int(message["step"])
                            if step > last_yielded + 1:
                                yield from backfill()  # a gap: a message may have been dropped
                            values = {key: value for key, value in message.get("values", {}).items()
                                      if not wanted or key in wanted}
                            if step > last_yielded and values:
                                if rest_cursor == last_yielded == step - 1:
                                    # Nothing between the cursor and this step: a later backfill
                                    # need not fetch it again.
                                    rest_cursor = step
                                last_yielded = step
                                yield RunEvent(kind="metrics", metrics=StepMetrics(step=step, values=values))
                            run = run.model_copy(update={
                                key: message[key] for key in ("status", "policy_version") if key in message
                            } | {"trainer_step": max(run.trainer_step, step)})
                            yield RunEvent(kind="status", run=run)
                        elif message.get("type") == "status":
                            run = run.model_copy(update={
                                key: message[key]
                                for key in ("status", "status_reason", "policy_version", "trainer_step")
                                if key in message
                            })
                            yield RunEvent(kind="status", run=run)
                            if run.ended and until_ended:
                                # Steps recorded before the end but dropped by the socket.
                                yield from backfill()
                                return
                except (ConnectionClosed, httpx.TransportError):
                    # Reconnect; the next open backfills what we miss meanwhile.
                    time.sleep(retry_s)


def login_path() -> Path:
    """Where ``tandem login`` saves the platform's URL and the token: ``$XDG_CONFIG_HOME/tandem/config.json``."""
    root = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(root) / "tandem" / "config.json"


def save_login(url: str, token: str) -> Path:
    path = login_path()
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Created 0600 from the start: the token is never readable by others, not even briefly.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        json.dump({"url": url, "token": token}, file)
        file.write("\n")
    os.chmod(path, 0o600)  # an existing file keeps its old mode through O_TRUNC
    return path


class LoginMissing(RuntimeError):
    """Neither ``$TANDEM_URL``/``$TANDEM_TOKEN`` nor a saved login say where to connect."""


def saved_login() -> tuple[str, str]:
    """``(url, token)``: ``$TANDEM_URL`` and ``$TANDEM_TOKEN`` when set, else what ``tandem login`` saved."""
    saved: dict[str, str] = {}
    path = login_path()
    if path.exists():
        try:
            saved = json.loads(path.read_text())
        except ValueError as exc:
            raise LoginMissing(f"{path} is not valid JSON ({exc}); run `tandem login` again") from None
    url = os.environ.get("TANDEM_URL") or saved.get("url")
    token = os.environ.get("TANDEM_TOKEN") or saved.get("token")
    if not url or not token:
        raise LoginMissing("not logged in: run `tandem login --url URL --token TOKEN` "
                           "or set TANDEM_URL and TANDEM_TOKEN")
    return url, token


class SweepsAPI:
    """Sweeps: runs of a base config over a search space, sampled and pruned by Optuna on the platform."""

    def __init__(self, transport: _Transport):
        self._transport = transport

    def create(self, *, environment: str, search_space: dict[str, Any], metric: str, max_runs: int,
               base_config: dict[str, Any] | None = None, sampler: str = "tpe", pruner: str = "none",
               goal: str = "maximize", concurrency: int = 1, seed: int = 0, name: str = "",
               project: int | None = None) -> dict[str, Any]:
        """Start a sweep; returns it as the API does (its trials, best trial and importances)."""
        body: dict[str, Any] = {"environment": environment, "search_space": search_space, "metric": metric,
                                "max_runs": max_runs, "base_config": base_config or {}, "sampler": sampler,
                                "pruner": pruner, "goal": goal, "concurrency": concurrency, "seed": seed,
                                "name": name}
        if project is not None:
            body["project"] = project
        return self._transport.request("POST", "/api/sweeps/", json=body)

    def list(self) -> Iterator[dict[str, Any]]:
        yield from self._transport.paginate("/api/sweeps/")

    def get(self, sweep_id: int) -> dict[str, Any]:
        return self._transport.request("GET", f"/api/sweeps/{sweep_id}/")

    def cancel(self, sweep_id: int) -> dict[str, Any]:
        return self._transport.request("POST", f"/api/sweeps/{sweep_id}/cancel/")


class TandemClient:
    """The platform's API for users: ``runs`` (with their metrics and sampled trajectories),
    ``environments``, ``datasets`` and ``projects``.
    """

    def __init__(self, base_url: str, token: str, *, timeout: float = 30.0):
        self._transport = _Transport(base_url, token, timeout=timeout)
        self.base_url = self._transport.base_url
        self.runs = RunsAPI(self._transport)
        self.environments = EnvironmentsAPI(self._transport)
        self.datasets = DatasetsAPI(self._transport)
        self.sweeps = SweepsAPI(self._transport)
        self.projects = ProjectsAPI(self._transport)

    @classmethod
    def from_login(cls, *, timeout: float = 30.0) -> TandemClient:
        """A client for the platform ``tandem login`` saved (or ``$TANDEM_URL`` and ``$TANDEM_TOKEN``)."""
        url, token = saved_login()
        return cls(url, token, timeout=timeout)

    def run_config_schema(self) -> dict[str, Any]:
        """RunConfig's JSON schema, as the platform validates it."""
        return self._transport.request("GET", "/api/run-config/schema/")

    def close(self) -> None:
        self._transport.http.close()

    def __enter__(self) -> TandemClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


__all__ = [
    "Dataset", "EndpointUnavailable", "Environment", "Evaluation", "EvaluationProgress", "LoginMissing",
    "MetricPoint", "MetricsPage", "Project", "Run", "RunEvent", "RunProgress", "RunWaitTimeout", "StepMetrics", "TandemAPIError", "TandemClient", "login_path",
    "save_login", "saved_login",
]
