"""Alert webhooks on the wire: which URLs may receive them, the signature, and the post itself.

A webhook URL is user input that makes the platform open a connection, so it is
checked against the operator's allow-list (``TANDEM_WEBHOOK_ALLOWED_HOSTS``) by the
rules remote environment URLs follow (tandem/allowlists/environment_urls.py): when the rule
is saved, and again for the addresses each post connects to, so that a name which
resolves elsewhere later (DNS rebinding) reaches nothing unlisted.

A receiver is someone else's server, so a post costs the platform a bounded amount
whatever it does: one deadline (``TANDEM_WEBHOOK_TIMEOUT_S``) covers the connect, the
send and every read together, each socket operation getting only what is left of it
(a receiver trickling a byte every few seconds is cut off at the deadline, where
per-operation timeouts would wait for ever); and at most ``RESPONSE_EXCERPT_BYTES`` of
the answer's body are read, then the connection is closed.
"""

from __future__ import annotations

import hashlib
import hmac
import ssl
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpcore
from django.conf import settings

from tandem.allowlists.environment_urls import (
    EnvironmentURLRefused,
    check_connect_addresses,
    check_environment_url,
    resolve_host,
)

ALLOWLIST_SETTING = "TANDEM_WEBHOOK_ALLOWED_HOSTS"
SIGNATURE_HEADER = "X-Tandem-Signature"
WEBHOOK_SCHEMES = frozenset({"http", "https"})
# What is read of a receiver's answer, and kept with the attempt: enough for Slack's "ok" or
# "invalid_token", or the start of an error page. Reads off the socket are no bigger either.
RESPONSE_EXCERPT_BYTES = 1024
# What a redacted URL shows instead of its path (webhook_url_redacted).
REDACTED_PATH = "/…"


class WebhookURLRefused(ValueError):
    """The URL is malformed, or not on the operator's webhook allow-list."""


def webhook_url_check(url: str) -> None:
    """Raise WebhookURLRefused unless the platform may post to ``url``; the host name is resolved here,
    where the connection will be made. Refusals never name the addresses a host name resolved to."""
    try:
        check_environment_url(url, allowlist=settings.TANDEM_WEBHOOK_ALLOWED_HOSTS, resolve=resolve_host,
                              schemes=WEBHOOK_SCHEMES, allowlist_setting=ALLOWLIST_SETTING,
                              refuse_private=settings.TANDEM_ENVIRONMENT_URL_REFUSE_PRIVATE)
    except EnvironmentURLRefused as error:
        raise WebhookURLRefused(str(error)) from None


def webhook_url_redacted(url: str) -> str:
    """``url`` as someone who may not use it sees it: scheme, host and port, the path masked.

    A chat webhook's URL is itself a credential (Slack's and Discord's carry their token in the
    path), so project viewers see where it posts, never the URL whole.
    """
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return f"{parts.scheme}://{host}{port}{REDACTED_PATH}" if host else REDACTED_PATH


def slack_escape(text: str) -> str:
    """``text`` as Slack's mrkdwn shows it literally: ``&``, ``<`` and ``>`` escaped, as Slack documents
    (https://api.slack.com/reference/surfaces/formatting#escaping), so that a run name or an
    environment's error cannot write ``<!channel>``, a mention, or a link disguised as other text."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def signature(secret: str, body: bytes) -> str:
    """The value of the signature header: ``sha256=`` and the hex HMAC-SHA256 of ``body`` under ``secret``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class PostResult:
    """What one post came to: the receiver's status code and the start of its answer, or the error
    that kept it from answering."""

    response_code: int | None
    error: str
    response_excerpt: str = ""

    @property
    def delivered(self) -> bool:
        return self.response_code is not None and 200 <= self.response_code < 300


class _Deadline:
    """The one deadline of a post; each socket operation may wait only for what is left of it."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self._at = time.monotonic() + seconds

    def bound(self, timeout: float | None, expired: type[httpcore.TimeoutException]) -> float:
        left = self._at - time.monotonic()
        if left <= 0:
            raise expired(f"the post's deadline of {self.seconds:g} s passed")
        return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose reads and writes share the post's deadline, reading at most
    RESPONSE_EXCERPT_BYTES at a time."""

    def __init__(self, stream: httpcore.NetworkStream, deadline: _Deadline):
        self._stream = stream
        self._deadline = deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(min(max_bytes, RESPONSE_EXCERPT_BYTES),
                                 timeout=self._deadline.bound(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        # In slices, so that a receiver that reads slowly cannot stretch one write past the deadline.
        for start in range(0, len(buffer), 16384):
            self._stream.write(buffer[start:start + 16384],
                               timeout=self._deadline.bound(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(self, ssl_context, server_hostname=None, timeout=None) -> httpcore.NetworkStream:
        stream = self._stream.start_tls(ssl_context, server_hostname=server_hostname,
                                        timeout=self._deadline.bound(timeout, httpcore.ConnectTimeout))
        return _DeadlineStream(stream, self._deadline)

    def get_extra_info(self, info: str):
        return self._stream.get_extra_info(info)


class _AllowListBackend(httpcore.SyncBackend):
    """Connects only to addresses the allow-list allows, checked as the connection is made, and
    within the post's deadline."""

    def __init__(self, deadline: _Deadline):
        self._deadline = deadline

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        try:
            addresses = resolve_host(host)
            check_connect_addresses(host, addresses, allowlist=settings.TANDEM_WEBHOOK_ALLOWED_HOSTS,
                                    allowlist_setting=ALLOWLIST_SETTING,
                                    refuse_private=settings.TANDEM_ENVIRONMENT_URL_REFUSE_PRIVATE)
        except (OSError, EnvironmentURLRefused) as error:
            raise httpcore.ConnectError(str(error)) from None
        # The checked address, not the name: a second lookup could answer differently. TLS still
        # verifies the certificate against the URL's host name (httpcore passes it as SNI).
        stream = super().connect_tcp(str(addresses[0]), port,
                                     timeout=self._deadline.bound(timeout, httpcore.ConnectTimeout),
                                     local_address=local_address, socket_options=socket_options)
        return _DeadlineStream(stream, self._deadline)


def _excerpt(response: httpcore.Response) -> str:
    """The first RESPONSE_EXCERPT_BYTES of the answer's body, as text PostgreSQL can store."""
    read = bytearray()
    for chunk in response.iter_stream():
        read += chunk
        if len(read) >= RESPONSE_EXCERPT_BYTES:
            break
    return bytes(read[:RESPONSE_EXCERPT_BYTES]).decode("utf-8", errors="replace").replace("\x00", "\ufffd")


def webhook_post(*, url: str, body: bytes, secret: str, delivery_id: int) -> PostResult:
    """POST ``body`` to ``url``, signed, within TANDEM_WEBHOOK_TIMEOUT_S in all; redirects are not
    followed (they could lead off the allow-list)."""
    headers = [
        (b"Content-Type", b"application/json"),
        (b"User-Agent", b"Tandem-Alerts"),
        (b"X-Tandem-Delivery", str(delivery_id).encode()),
        (SIGNATURE_HEADER.encode(), signature(secret, body).encode()),
    ]
    timeout = settings.TANDEM_WEBHOOK_TIMEOUT_S
    deadline = _Deadline(timeout)
    try:
        # One connection, closed on leaving: a body left unread is never drained.
        with httpcore.ConnectionPool(network_backend=_AllowListBackend(deadline), max_connections=1,
                                     ssl_context=ssl.create_default_context()) as pool, \
                pool.stream("POST", url, headers=headers, content=body, extensions={
                    "timeout": {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}},
                ) as response:
            status, excerpt = response.status, _excerpt(response)
    except (TimeoutError, httpcore.TimeoutException):
        return PostResult(response_code=None,
                          error=f"no complete answer within the post's deadline of {timeout:g} s")
    except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol, OSError,
            ValueError, OverflowError) as error:
        return PostResult(response_code=None, error=f"{type(error).__name__}: {error}"[:500])
    if 200 <= status < 300:
        return PostResult(response_code=status, error="", response_excerpt=excerpt)
    return PostResult(response_code=status, error=f"the receiver answered {status}", response_excerpt=excerpt)
