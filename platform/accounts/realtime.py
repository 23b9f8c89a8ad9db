"""Each user's WebSocket group: a consumer joins it so that losing access closes its sockets.

Sending is best effort (a failed send is logged): consumers also re-check access
on their own every ``ACCESS_RECHECK_S`` while messages flow (runs.consumers).
"""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

logger = logging.getLogger(__name__)

#: The message a user's sockets get when their access may have shrunk.
ACCESS_CHANGED = {"type": "access.changed"}


def user_group_name(user_id: int) -> str:
    return f"user-{user_id}"


def user_access_changed_on_commit(user_id: int) -> None:
    """Once the transaction commits, have the user's open sockets re-check what they may see."""

    def send() -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        try:
            async_to_sync(layer.group_send)(user_group_name(user_id), ACCESS_CHANGED)
        except Exception:
            logger.warning("could not tell user %s's sockets that access changed", user_id, exc_info=True)

    transaction.on_commit(send)
