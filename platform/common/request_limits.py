"""Request bodies held to their route's cap and deadline, in front of Django.

Django's ASGI handler reads a whole body into a spooled temporary file before it routes
the request: a view's or an upload handler's cap, and authentication, come after the disk
(or the memory) is spent. This ASGI middleware wraps the Django app and refuses

- with 413, a body whose Content-Length is past its route's cap, before reading any of it;
- with 413, a body sent without one (chunked) at the first byte past the cap;
- with 408, a body that has not arrived whole within its route's deadline (a client
  trickling it, or sending nothing more).

The limits are settings (config/settings/request_limits.py): a small default, and the
upload routes' own by URL name. Each refusal is logged with its route and reason.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from django.conf import settings
from django.urls import Resolver404, resolve

from tandem.contracts import ErrorCode

logger = logging.getLogger(__name__)

Scope = dict
Message = dict
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class BodyLimit:
    """How many bytes a request's body may have, and how many seconds it may take to arrive."""

    max_bytes: int
    timeout_s: float


class BodyRefused(Exception):
    """Raised out of ``receive`` into the app: the body is refused, and the app must read no more."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def _too_large(limit: BodyLimit) -> BodyRefused:
    return BodyRefused(413, "too_large", f"The request body is larger than this route takes ({limit.max_bytes} "
                       "bytes; TANDEM_REQUEST_MAX_BYTES, or the route's own upload cap).")


def _too_slow(limit: BodyLimit) -> BodyRefused:
    return BodyRefused(408, "request_timeout", f"The request body did not arrive within {limit.timeout_s:g} s "
                       "(TANDEM_REQUEST_BODY_TIMEOUT_S, or the route's own upload deadline).")


class _LimitedBody:
    """The app's ``receive``: the body's messages, counted against the cap and the deadline."""

    def __init__(self, receive: Receive, limit: BodyLimit):
        self._receive = receive
        self._limit = limit
        self._deadline = asyncio.get_running_loop().time() + limit.timeout_s
        self._received = 0
        self._complete = False

    async def __call__(self) -> Message:
        if self._complete:
            # After the body only a disconnect comes, which Django waits for while it answers.
            return await self._receive()
        try:
            async with asyncio.timeout_at(self._deadline):
                message = await self._receive()
        except TimeoutError:
            raise _too_slow(self._limit) from None
        if message["type"] == "http.request":
            self._received += len(message.get("body", b""))
            if self._received > self._limit.max_bytes:
                raise _too_large(self._limit)
            self._complete = not message.get("more_body", False)
        return message


class RequestBodyLimits:
    """ASGI middleware: HTTP bodies past their route's cap or deadline never reach ``app``."""

    def __init__(self, app: ASGIApp, *, default: BodyLimit, by_route: Mapping[str, BodyLimit]):
        self.app = app
        self.default = default
        self.by_route = dict(by_route)

    @classmethod
    def from_settings(cls, app: ASGIApp) -> RequestBodyLimits:
        by_route = {name: BodyLimit(max_bytes=int(max_bytes), timeout_s=float(timeout_s))
                    for name, (max_bytes, timeout_s) in settings.TANDEM_REQUEST_BODY_LIMITS_BY_ROUTE.items()}
        return cls(app, default=BodyLimit(max_bytes=settings.TANDEM_REQUEST_MAX_BYTES,
                                          timeout_s=settings.TANDEM_REQUEST_BODY_TIMEOUT_S), by_route=by_route)

    def limit_for(self, path: str) -> BodyLimit:
        try:
            url_name = resolve(path).url_name
        except Resolver404:
            return self.default
        return self.by_route.get(url_name, self.default)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit_for(scope["path"])
        try:
            declared = _content_length(scope)
        except ValueError:
            await _answer(send, 400, ErrorCode.INVALID, "Content-Length is not a number of bytes.")
            return
        if declared is not None and declared > limit.max_bytes:
            await self._refuse(scope, send, _too_large(limit), received_any=False)
            return
        response_started = False

        async def send_tracking(message: Message) -> None:
            nonlocal response_started
            response_started = response_started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, _LimitedBody(receive, limit), send_tracking)
        except BodyRefused as refusal:
            if response_started:  # an app that answers before reading its body: it has answered
                return
            await self._refuse(scope, send, refusal, received_any=True)

    async def _refuse(self, scope: Scope, send: Send, refusal: BodyRefused, *, received_any: bool) -> None:
        logger.warning("refused %s %s with %s (%s)%s", scope["method"], scope["path"], refusal.status,
                       refusal.code, "" if received_any else " before reading its body")
        await _answer(send, refusal.status, refusal.code, refusal.message)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            length = int(value)
            if length < 0:
                raise ValueError(value)
            return length
    return None


async def _answer(send: Send, status: int, code: str, message: str) -> None:
    """The API's error shape (common/exception_handler.py); the connection is closed after it,
    so the rest of a refused body is never read."""
    body = json.dumps({"error": {"code": str(code), "message": message, "fields": {}}}).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]})
    await send({"type": "http.response.body", "body": body})
