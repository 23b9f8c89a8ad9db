"""Alert webhooks on the wire: which URLs may receive them, the signature, and the post itself.

A webhook URL is user input that makes the platform open a connection, so it is
checked against the operator's allow-list (``TANDEM_WEBHOOK_ALLOWED_HOSTS``) by the
rules remote environment URLs follow (tandem/environment_urls.py): when the rule
is saved, and again for the addresses each post connects to, so that a name which
resolves elsewhere later (DNS rebinding) reaches nothing unlisted.
"""

from __future__ import annotations

import hashlib
import hmac
import ssl
from dataclasses import dataclass

import httpcore
from django.conf import settings

from tandem.environment_urls import (
    EnvironmentURLRefused,
    check_connect_addresses,
    check_environment_url,
    resolve_host,
)

ALLOWLIST_SETTING = "TANDEM_WEBHOOK_ALLOWED_HOSTS"
SIGNATURE_HEADER = "X-Tandem-Signature"
WEBHOOK_SCHEMES = frozenset({"http", "https"})


class WebhookURLRefused(ValueError):
    """The URL is malformed, or not on the operator's webhook allow-list."""


def webhook_url_check(url: str) -> None:
    """Raise WebhookURLRefused unless the platform may post to ``url``; the host name is resolved here,
    where the connection will be made."""
    try:
        check_environment_url(url, allowlist=settings.TANDEM_WEBHOOK_ALLOWED_HOSTS, resolve=resolve_host,
                              schemes=WEBHOOK_SCHEMES, allowlist_setting=ALLOWLIST_SETTING)
    except EnvironmentURLRefused as error:
        raise WebhookURLRefused(str(error)) from None


def signature(secret: str, body: bytes) -> str:
    """The value of the signature header: ``sha256=`` and the hex HMAC-SHA256 of ``body`` under ``secret``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class PostResult:
    """What one post came to: the receiver's status code, or the error that kept it from answering."""

    response_code: int | None
    error: str

    @property
    def delivered(self) -> bool:
        return self.response_code is not None and 200 <= self.response_code < 300


class _AllowListBackend(httpcore.SyncBackend):
    """Connects only to addresses the allow-list allows, checked as the connection is made."""

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        try:
            addresses = resolve_host(host)
            check_connect_addresses(host, addresses, allowlist=settings.TANDEM_WEBHOOK_ALLOWED_HOSTS,
                                    allowlist_setting=ALLOWLIST_SETTING)
        except (OSError, EnvironmentURLRefused) as error:
            raise httpcore.ConnectError(str(error)) from None
        # The checked address, not the name: a second lookup could answer differently. TLS still
        # verifies the certificate against the URL's host name (httpcore passes it as SNI).
        return super().connect_tcp(str(addresses[0]), port, timeout=timeout, local_address=local_address,
                                   socket_options=socket_options)


def webhook_post(*, url: str, body: bytes, secret: str, delivery_id: int) -> PostResult:
    """POST ``body`` to ``url``, signed; redirects are not followed (they could lead off the allow-list)."""
    headers = [
        (b"Content-Type", b"application/json"),
        (b"User-Agent", b"Tandem-Alerts"),
        (b"X-Tandem-Delivery", str(delivery_id).encode()),
        (SIGNATURE_HEADER.encode(), signature(secret, body).encode()),
    ]
    timeout = settings.TANDEM_WEBHOOK_TIMEOUT_S
    try:
        with httpcore.ConnectionPool(network_backend=_AllowListBackend(),
                                     ssl_context=ssl.create_default_context()) as pool:
            response = pool.request("POST", url, headers=headers, content=body, extensions={
                "timeout": {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}})
    except (TimeoutError, httpcore.TimeoutException):
        return PostResult(response_code=None, error=f"no answer within {timeout:g} s")
    except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol, OSError) as error:
        return PostResult(response_code=None, error=f"{type(error).__name__}: {error}"[:500])
    if 200 <= response.status < 300:
        return PostResult(response_code=response.status, error="")
    return PostResult(response_code=response.status, error=f"the receiver answered {response.status}")
