"""Live updates of one run over a WebSocket."""

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from .realtime import run_group_name
from .selectors import run_is_visible


class RunConsumer(AsyncJsonWebsocketConsumer):
    """Forwards the run group's messages (``metrics`` and ``status``) to a member's browser.

    The socket is a notifier, never the record: a client that was away
    backfills from ``/api/runs/<id>/metrics/``.
    """

    group_name: str | None = None

    async def connect(self):
        run_id = self.scope["url_route"]["kwargs"]["run_id"]
        user = self.scope.get("user")
        if user is None or not await database_sync_to_async(run_is_visible)(
            user=user, run_id=run_id
        ):
            await self.close(code=4403)  # before accept: the handshake is refused
            return
        self.group_name = run_group_name(run_id)
        await self.channel_layer.group_add(self.group_name, self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        if self.group_name is not None:
            await self.channel_layer.group_discard(self.group_name, self.channel_name)

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        pass  # the socket only speaks one way; whatever a client sends is ignored

    async def metrics(self, event):
        await self.send_json(event)

    async def status(self, event):
        await self.send_json(event)
