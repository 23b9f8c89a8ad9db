"""Who is on the other end of a WebSocket.

AuthMiddlewareStack puts the session's user in the scope; this middleware, inside
it, lets scripts authenticate with ``Authorization: Token <key>`` instead, and
drops the session user of a cross-site browser connection: browsers send cookies
on any page's WebSocket, so an Origin that differs from the Host is refused.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from channels.db import database_sync_to_async
from channels.middleware import BaseMiddleware
from django.contrib.auth.models import AnonymousUser

from .authentication import token_from_header, token_user


class TokenAuthMiddleware(BaseMiddleware):
    async def __call__(self, scope, receive, send):
        scope = dict(scope)
        headers = {name.lower(): value for name, value in scope.get("headers", [])}
        raw = token_from_header(headers.get(b"authorization", b"").decode("latin-1"))
        if raw:
            found = await database_sync_to_async(token_user)(raw)
            scope["user"] = found[0] if found else AnonymousUser()
            # Consumers re-check that this token still exists (selectors.websocket_credential_is_valid).
            scope["api_token_id"] = found[1].pk if found else None
        elif not _same_origin(headers.get(b"origin"), headers.get(b"host")):
            scope["user"] = AnonymousUser()
        return await super().__call__(scope, receive, send)


def _same_origin(origin: bytes | None, host: bytes | None) -> bool:
    if origin is None:
        return True  # not a browser: browsers always send Origin on a WebSocket handshake
    return host is not None and urlsplit(origin.decode("latin-1")).netloc == host.decode("latin-1")
