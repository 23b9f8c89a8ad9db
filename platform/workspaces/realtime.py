"""The project's WebSocket group: every step's metrics of each of its runs, for the workspace and reports.

Runs' services send to it beside each run's own group (runs.realtime.project_broadcast_on_commit); this
module names the socket a page opens.
"""

from runs.realtime import project_group_name

__all__ = ["project_group_name", "project_websocket_path"]


def project_websocket_path(project_id: int) -> str:
    """Where a browser subscribes to the project's runs' metrics (workspaces/routing.py)."""
    return f"/ws/projects/{project_id}/"
