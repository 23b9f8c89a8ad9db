"""Each user's live unread count: the navigation's badge follows it over a WebSocket (alerts.consumers).

Sending is best effort (a failed send is logged): the badge is drawn from the database on every page, and
the socket sends the count again each time it opens.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from .models import Notification

logger = logging.getLogger(__name__)

NOTIFICATIONS_WEBSOCKET_PATH = "/ws/notifications/"


def notification_group_name(user_id: int) -> str:
    return f"notifications-{user_id}"


def unread_message(user_id: int) -> dict:
    """The message a user's badge draws: how many of their notifications are unread."""
    unread = Notification.objects.filter(user_id=user_id, read_at__isnull=True).count()
    return {"type": "notifications.unread", "unread": unread}


def notifications_changed_on_commit(user_ids: Iterable[int]) -> None:
    """Once the transaction commits, send each of ``user_ids`` their unread count."""
    user_ids = sorted(set(user_ids))

    def send() -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        for user_id in user_ids:
            try:
                async_to_sync(layer.group_send)(notification_group_name(user_id), unread_message(user_id))
            except Exception:
                logger.warning("could not send user %s their unread count", user_id, exc_info=True)

    transaction.on_commit(send, robust=True)
