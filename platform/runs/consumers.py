"""Live updates of one run over a WebSocket."""

import time

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from accounts.realtime import user_group_name
from accounts.selectors import websocket_credential_is_valid

from .realtime import run_group_name
from .selectors import run_is_visible, run_is_visible_to_user_id

# While messages flow, access is re-checked at most this often (a deactivated user, a logged-out
# session, say); removal from the project and a revoked token close the socket at once (accounts.realtime).
ACCESS_RECHECK_S = 5.0
# The close code of a socket whose user may not see the run (now or any more).
FORBIDDEN_CLOSE_CODE = 4403
# The close code of a socket whose token was revoked or whose session logged out since it opened.
UNAUTHENTICATED_CLOSE_CODE = 4401


class RunConsumer(AsyncJsonWebsocketConsumer):
    """Forwards the run group's messages (``metrics``, ``status``, ``evaluation`` and ``logs``) to a member's browser.

    The socket is a notifier, never the record: a client that was away
    backfills from ``/api/runs/<id>/metrics/`` (and ``/evaluations/``).
    """

    group_name: str | None = None
    user_group: str | None = None
    denied = False

    async def connect(self):
        run_id = self.scope["url_route"]["kwargs"]["run_id"]
        user = self.scope.get("user")
        if user is None or not await database_sync_to_async(run_is_visible)(
            user=user, run_id=run_id
        ):
            await self.close(code=FORBIDDEN_CLOSE_CODE)  # before accept: the handshake is refused
            return
        self.run_id = run_id
        await self._join(user, run_group_name(run_id))

    async def _join(self, user, group_name: str) -> None:
        """Accept ``user``'s socket into ``group_name`` and the user's own group (access changes)."""
        self.user_id = user.pk
        # What it authenticated with, re-checked with access: a token (accounts.websocket_auth) or the session.
        self.api_token_id = self.scope.get("api_token_id")
        session = self.scope.get("session")
        self.session_key = None if self.api_token_id or session is None else session.session_key
        self.checked_at = time.monotonic()
        self.group_name = group_name
        self.user_group = user_group_name(user.pk)
        await self.channel_layer.group_add(self.group_name, self.channel_name)
        await self.channel_layer.group_add(self.user_group, self.channel_name)
        await self.accept()

    async def disconnect(self, code):
        for group in (self.group_name, self.user_group):
            if group is not None:
                await self.channel_layer.group_discard(group, self.channel_name)

    async def _allowed(self, *, now: bool = False) -> bool:
        """Whether the socket's credential is still valid and its user may still see the run;
        checked ``now`` or once per ACCESS_RECHECK_S."""
        if self.denied:
            return False
        if not now and time.monotonic() - self.checked_at < ACCESS_RECHECK_S:
            return True
        self.checked_at = time.monotonic()
        code = await database_sync_to_async(self._close_code)()
        if code is None:
            return True
        self.denied = True
        await self.disconnect(code)  # leave the groups: nothing more is sent
        await self.close(code=code)
        return False

    def _close_code(self) -> int | None:
        if not websocket_credential_is_valid(user_id=self.user_id, api_token_id=self.api_token_id,
                                             session_key=self.session_key):
            return UNAUTHENTICATED_CLOSE_CODE
        if not self._still_visible():
            return FORBIDDEN_CLOSE_CODE
        return None

    def _still_visible(self) -> bool:
        """Whether the user may still see what the socket follows (a subclass follows something else)."""
        return run_is_visible_to_user_id(user_id=self.user_id, run_id=self.run_id)

    async def access_changed(self, event):
        await self._allowed(now=True)

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        pass  # the socket only speaks one way; whatever a client sends is ignored

    async def metrics(self, event):
        if await self._allowed():
            await self.send_json(event)

    async def status(self, event):
        if await self._allowed():
            await self.send_json(event)

    async def evaluation(self, event):
        if await self._allowed():
            await self.send_json(event)

    async def logs(self, event):
        """New lines of the run's log were stored (run_logs.realtime); the page fetches them over REST."""
        if await self._allowed():
            await self.send_json(event)
