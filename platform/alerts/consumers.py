"""A signed-in user's unread notification count, live over a WebSocket (the navigation's badge)."""

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from accounts.realtime import user_group_name
from accounts.selectors import websocket_credential_is_valid

from .realtime import notification_group_name, unread_message

# The close code of a socket without a user, or whose token was revoked or session logged out since.
UNAUTHENTICATED_CLOSE_CODE = 4401


class NotificationConsumer(AsyncJsonWebsocketConsumer):
    """Sends ``{"type": "notifications.unread", "unread": n}`` on connect and whenever it changes.

    A user's own count, of no project in particular: it needs only a valid credential, re-checked
    before each send and when the user's access changes (a revoked token, a logout).
    """

    groups_joined: tuple[str, ...] = ()

    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=UNAUTHENTICATED_CLOSE_CODE)
            return
        self.user_id = user.pk
        self.api_token_id = self.scope.get("api_token_id")
        session = self.scope.get("session")
        self.session_key = None if self.api_token_id or session is None else session.session_key
        self.groups_joined = (notification_group_name(user.pk), user_group_name(user.pk))
        for group in self.groups_joined:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        await self.send_json(await database_sync_to_async(unread_message)(self.user_id))

    async def disconnect(self, code):
        for group in self.groups_joined:
            await self.channel_layer.group_discard(group, self.channel_name)

    async def _allowed(self) -> bool:
        valid = await database_sync_to_async(websocket_credential_is_valid)(
            user_id=self.user_id, api_token_id=self.api_token_id, session_key=self.session_key)
        if not valid:
            await self.disconnect(UNAUTHENTICATED_CLOSE_CODE)
            await self.close(code=UNAUTHENTICATED_CLOSE_CODE)
        return valid

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        pass  # the socket only speaks one way

    async def access_changed(self, event):
        await self._allowed()

    async def notifications_unread(self, event):
        if await self._allowed():
            await self.send_json(event)
