"""The navigation's notification badge (frontend/templates/base.html), and where it updates from."""

from django import template

from alerts.realtime import NOTIFICATIONS_WEBSOCKET_PATH
from alerts.selectors import notification_unread_count

register = template.Library()


@register.simple_tag(takes_context=True)
def unread_notification_count(context) -> int:
    """The signed-in user's unread notifications; 0 for anyone else."""
    user = context.get("user")
    if user is None or not user.is_authenticated:
        return 0
    return notification_unread_count(user=user)


@register.simple_tag
def notifications_websocket_path() -> str:
    """Where the badge's count comes live from (alerts.consumers)."""
    return NOTIFICATIONS_WEBSOCKET_PATH
