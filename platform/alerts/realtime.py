"""Each user's live unread count: the navigation's badge follows it over a WebSocket (alerts.consumers).

Sending is best effort (a failed send is logged): the badge is drawn from the database on every page, and
the socket sends the count again each time it opens.
"""

from __future__ import annotations

from collections.abc import Iterable

from common.channel_groups import group_send_on_commit

from .models import Notification

NOTIFICATIONS_WEBSOCKET_PATH = "/ws/notifications/"


def notification_group_name(user_id: int) -> str:
    return f"notifications-{user_id}"


def unread_message(user_id: int) -> dict:
    """The message a user's badge draws: how many of their notifications are unread."""
    unread = Notification.objects.filter(user_id=user_id, read_at__isnull=True).count()
    return {"type": "notifications.unread", "unread": unread}


def notifications_changed_on_commit(user_ids: Iterable[int]) -> None:
    """Once the transaction commits, send each of ``user_ids`` their unread count (read then)."""
    for user_id in sorted(set(user_ids)):
        group_send_on_commit(notification_group_name(user_id), lambda user_id=user_id: [unread_message(user_id)])
