"""Each user's WebSocket group: a consumer joins it so that losing access closes its sockets.

Sending is best effort (a failed send is logged): consumers also re-check access
on their own every ``ACCESS_RECHECK_S`` while messages flow (runs.consumers).
"""

from __future__ import annotations

from common.channel_groups import group_send_on_commit

#: The message a user's sockets get when their access may have shrunk.
ACCESS_CHANGED = {"type": "access.changed"}


def user_group_name(user_id: int) -> str:
    return f"user-{user_id}"


def user_access_changed_on_commit(user_id: int) -> None:
    """Once the transaction commits, have the user's open sockets re-check what they may see."""
    group_send_on_commit(user_group_name(user_id), [ACCESS_CHANGED])
