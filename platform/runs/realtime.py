"""The run's WebSocket group: its name and how services send to it.

Messages are compact deltas for open browser tabs. Sending is best effort: a
tab that misses one backfills over REST, so a failed send is logged, not raised.
"""

from __future__ import annotations

from common.channel_groups import group_send, group_send_on_commit


def run_group_name(run_id: int) -> str:
    return f"run-{run_id}"


def project_group_name(project_id: int) -> str:
    """The group that hears every step's metrics of the project's runs (the workspace's socket)."""
    return f"project-{project_id}"


def run_websocket_path(run_id: int) -> str:
    """Where a browser or script subscribes to the run (see runs/routing.py)."""
    return f"/ws/runs/{run_id}/"


def run_broadcast_on_commit(run_id: int, messages: list[dict]) -> None:
    """Send ``messages`` to the run's group once the current transaction commits."""
    if messages:
        group_send_on_commit(run_group_name(run_id), messages)


def run_broadcast(run_id: int, messages: list[dict]) -> None:
    group_send(run_group_name(run_id), messages)


def project_broadcast_on_commit(project_id: int, messages: list[dict]) -> None:
    """Send ``messages`` to the project's group once the current transaction commits."""
    if messages:
        group_send_on_commit(project_group_name(project_id), messages)
