"""Sending to a Channels group, best effort: the dashboard's sockets are notifiers, never the record (a page
that missed a message reads again over REST), so a failed send is logged, never raised into the write that
caused it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

logger = logging.getLogger(__name__)


def group_send(group: str, messages: Sequence[dict]) -> None:
    """Send ``messages`` to ``group`` now, in order (nothing without a channel layer)."""
    layer = get_channel_layer()
    if layer is None or not messages:
        return
    try:
        async_to_sync(_send_all)(layer, group, messages)
    except Exception:
        logger.warning("Could not send %d message(s) to %s", len(messages), group, exc_info=True)


def group_send_on_commit(group: str, messages: Sequence[dict] | Callable[[], Sequence[dict]]) -> None:
    """Send ``messages`` to ``group`` once the current transaction commits: a list, or a function that makes
    them then (an unread count read after the write that changed it)."""
    transaction.on_commit(lambda: group_send(group, messages() if callable(messages) else messages), robust=True)


async def _send_all(layer, group: str, messages: Sequence[dict]) -> None:
    for message in messages:
        await layer.group_send(group, message)
