"""The run's WebSocket group: its name and how services send to it.

Messages are compact deltas for open browser tabs. Sending is best effort: a
tab that misses one backfills over REST, so a failed send is logged, not raised.
"""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

logger = logging.getLogger(__name__)


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
        transaction.on_commit(lambda: run_broadcast(run_id, messages))


def run_broadcast(run_id: int, messages: list[dict]) -> None:
    _broadcast(run_group_name(run_id), messages)


def project_broadcast_on_commit(project_id: int, messages: list[dict]) -> None:
    """Send ``messages`` to the project's group once the current transaction commits."""
    if messages:
        transaction.on_commit(lambda: _broadcast(project_group_name(project_id), messages))


def _broadcast(group: str, messages: list[dict]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(_send_all)(layer, group, messages)
    except Exception:
        logger.warning("Could not broadcast %d message(s) to %s", len(messages), group, exc_info=True)


async def _send_all(layer, group: str, messages: list[dict]) -> None:
    for message in messages:
        await layer.group_send(group, message)
