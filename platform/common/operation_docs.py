"""What /api/docs/ says of each operation, and which operations it shows to whom.

drf-spectacular gives an operation no summary, and for its description takes the
view's docstring, which a view serving several methods shares between them: POST
/api/runs/ read "The runs of the caller's projects". So every operation's summary,
and its description wherever the view's docstring is not about that operation
alone, is written here, in one table a reader can check against the routes in
config/urls.py. An operation the table misses still gets a summary: the one its
view gives with ``extend_schema(summary=...)``, or the first sentence of its
description.

The trainer's routes (/api/trainer/...) are the trainer process's contract with
the platform, of no use to anyone else: people who are not trainers get a schema
without them. The schema made without a request (``manage.py spectacular``) keeps
every operation.
"""

from __future__ import annotations

import re

# (method, path) -> (summary, description or None to keep the view's docstring).
OPERATION_DOCS: dict[tuple[str, str], tuple[str, str | None]] = {
    ("GET", "/api/"): ("API index", "Links to the API's main collections, its schema and its docs."),
    # Tokens
    ("GET", "/api/tokens/"): ("List your API tokens", None),
    ("POST", "/api/tokens/"): (
        "Create an API token",
        "A new token of the caller's. The answer holds its raw value, shown this once: only a hash is stored.",
    ),
    ("GET", "/api/tokens/{token_id}/"): ("Get an API token", "One of the caller's tokens (its prefix, never its value)."),
    ("DELETE", "/api/tokens/{token_id}/"): ("Revoke an API token", None),
    # Projects
    ("GET", "/api/projects/"): ("List your projects", None),
    ("POST", "/api/projects/"): ("Create a project", "A new project, owned by the caller."),
    ("GET", "/api/projects/{project_id}/"): ("Get a project", "One of the caller's projects, with the caller's role in it."),
    ("GET", "/api/projects/{project_id}/members/"): (
        "List a project's members", "Who belongs to the project, with their roles; any member may read it.",
    ),
    ("POST", "/api/projects/{project_id}/members/"): (
        "Add a member", "Add a user to the project with a role; only owners may.",
    ),
    ("GET", "/api/projects/{project_id}/members/{username}/"): ("Get a member", "One member of the project and their role."),
    ("PATCH", "/api/projects/{project_id}/members/{username}/"): (
        "Change a member's role", "Give a member another role; only owners may, and the last owner stays one.",
    ),
    ("DELETE", "/api/projects/{project_id}/members/{username}/"): (
        "Remove a member", "Take a user out of the project; only owners may, and never its last owner.",
    ),
    # Environments
    ("GET", "/api/environments/"): ("List environments", "The environments of the caller's projects (``?project=`` for one)."),
    ("POST", "/api/environments/"): (
        "Register an environment",
        "A new environment and its version 1, probed before any run uses it. Members and owners only.",
    ),
    ("GET", "/api/environments/{environment_id}/"): ("Get an environment", "One environment, with its versions."),
    ("POST", "/api/environments/{environment_id}/versions/"): (
        "Register an environment version", "The environment's next version, probed before any run uses it.",
    ),
    ("GET", "/api/environments/{environment_id}/versions/{number}/"): (
        "Get an environment version", "One version: its spec, status and probes.",
    ),
    ("POST", "/api/environments/{environment_id}/versions/{number}/probe/"): (
        "Probe an environment version", "Probe the version again; 202 with the queued probe.",
    ),
    # Datasets
    ("GET", "/api/datasets/"): ("List datasets", "The datasets of the caller's projects."),
    ("POST", "/api/datasets/"): (
        "Upload a dataset version",
        "A JSONL file of chat rows: a new version of the named dataset (version 1 for a new name).",
    ),
    ("GET", "/api/datasets/{dataset_id}/"): ("Get a dataset", "One dataset, with its versions."),
    ("GET", "/api/datasets/{dataset_id}/versions/{number}/"): (
        "Get a dataset version", "One version of a dataset: its source file, size, hash and row and message counts.",
    ),
    ("GET", "/api/datasets/{dataset_id}/versions/{number}/rows/"): ("Read a dataset version's rows", None),
    # Runs
    ("GET", "/api/runs/"): ("List runs", None),
    ("POST", "/api/runs/"): (
        "Start a run",
        "Queue a new run of an environment with a config; 201 with the run. Members and owners only.",
    ),
    # The metric explorer's saved layouts
    ("GET", "/api/metric-explorer/layout/"): (
        "Get your metric explorer layout",
        "Your saved panels and smoothing of one page: the run page (``?page=run``) or the comparison (``?page=compare``).",
    ),
    ("PUT", "/api/metric-explorer/layout/"): (
        "Save your metric explorer layout",
        "Replace your saved panels and smoothing of one page (``page``: run or compare).",
    ),
    ("GET", "/api/runs/{run_id}/"): ("Get a run", "One run: status, progress, config and attempts."),
    ("PATCH", "/api/runs/{run_id}/"): (
        "Edit a run's tags and notes", "Set the run's tags and notes; writers of its project only.",
    ),
    ("POST", "/api/runs/{run_id}/cancel/"): ("Cancel a run", "End the run for good; its trainer learns so at its next heartbeat."),
    ("POST", "/api/runs/{run_id}/pause/"): (
        "Pause a run", "Its trainer checkpoints and lets go of it; resume it later.",
    ),
    ("POST", "/api/runs/{run_id}/resume/"): (
        "Resume a run", "Queue a paused or failed run again; it continues from its last checkpoint.",
    ),
    ("POST", "/api/runs/{run_id}/clone/"): (
        "Clone a run", "A new queued run with the run's config, changed by the keys given.",
    ),
    ("POST", "/api/runs/{run_id}/evaluate/"): ("Evaluate a checkpoint", None),
    ("GET", "/api/runs/{run_id}/metrics/"): ("Read a run's metric points", None),
    ("GET", "/api/runs/{run_id}/metrics/series/"): ("Read a run's series for a chart", None),
    ("GET", "/api/runs/{run_id}/evaluations/"): ("List a run's evaluations", None),
    ("GET", "/api/runs/{run_id}/evaluations/progress/"): ("Read evaluation progress", None),
    ("GET", "/api/runs/{run_id}/trajectories/"): ("List a run's trajectories", None),
    ("GET", "/api/runs/{run_id}/trajectories/{trajectory_id}/"): (
        "Get a trajectory", "One sampled trajectory: its turns, tokens, trained mask and reward.",
    ),
    ("GET", "/api/runs/{run_id}/trajectory-groups/{group_id}/"): ("Get a sampled GRPO group", None),
    ("GET", "/api/runs/{run_id}/devices/"): ("Read a run's devices", None),
    ("GET", "/api/runs/{run_id}/timeline/"): ("Read a run's step timeline", None),
    ("GET", "/api/runs/{run_id}/traces/"): ("List a run's traces", "The run's profiler traces, newest first."),
    ("POST", "/api/runs/{run_id}/traces/"): (
        "Request a trace", 'Ask the run\'s trainer for a jax.profiler trace of its next ``{"steps": n}`` steps.',
    ),
    ("GET", "/api/runs/{run_id}/traces/{trace_id}/download/"): ("Download a trace", None),
    ("GET", "/api/runs/{run_id}/checkpoints/"): ("List a run's checkpoints", None),
    ("GET", "/api/runs/{run_id}/checkpoints/{step}/"): (
        "Get a checkpoint", "One checkpoint of the run; poll its ``export_status`` after an export.",
    ),
    ("DELETE", "/api/runs/{run_id}/checkpoints/{step}/"): (
        "Delete a checkpoint", "Remove the checkpoint's files; its record stays, marked deleted.",
    ),
    ("POST", "/api/runs/{run_id}/checkpoints/{step}/export/"): ("Export a checkpoint", None),
    ("GET", "/api/runs/{run_id}/checkpoints/{step}/download/"): ("Download an exported checkpoint", None),
    ("GET", "/api/devices/"): ("List devices of active runs", None),
    ("GET", "/api/processes/"): ("List Tandem processes", None),
    ("GET", "/api/run-config/schema/"): ("Get the run config's JSON schema", None),
    # The trainer's
    ("POST", "/api/trainer/claim/"): (
        "Claim the next queued run",
        "For trainers: the oldest queued run whose environment version is ready, now held by the caller "
        "(the run it already holds, if any); 204 if none.",
    ),
    ("POST", "/api/trainer/runs/{run_id}/heartbeat/"): (
        "Send a heartbeat", "For the trainer holding the run: its progress; the reply says the run's status.",
    ),
    ("POST", "/api/trainer/runs/{run_id}/telemetry/"): ("Post step events", None),
    ("POST", "/api/trainer/runs/{run_id}/trajectories/"): ("Post trajectory samples", None),
    ("POST", "/api/trainer/runs/{run_id}/traces/{trace_id}/"): ("Upload a trace", None),
    ("POST", "/api/trainer/runs/{run_id}/checkpoints/"): ("Report checkpoints", None),
    ("POST", "/api/trainer/runs/{run_id}/evaluations/"): ("Report an evaluation", None),
    ("GET", "/api/trainer/runs/{run_id}/datasets/{name}/versions/{number}/rows/"): ("Read dataset rows for training", None),
}

_FIRST_SENTENCE = re.compile(r"^(.+?[.:;])(\s|$)", re.DOTALL)


def describe_operations(result, generator, request, public):
    """drf-spectacular postprocessing hook: each operation's summary and its own description."""
    for path, operations in result["paths"].items():
        for method, operation in operations.items():
            summary, description = OPERATION_DOCS.get((method.upper(), path), (None, None))
            if description is not None:
                operation["description"] = description
            if not operation.get("summary"):
                operation["summary"] = summary or _summary_from(operation, method, path)
    return result


def _summary_from(operation: dict, method: str, path: str) -> str:
    description = " ".join((operation.get("description") or "").split())
    match = _FIRST_SENTENCE.match(description)
    if match:
        return match.group(1).rstrip(".:;")
    return description or f"{method.upper()} {path}"
