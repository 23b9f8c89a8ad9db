"""The format of API tokens: how a raw value is made, hashed, and shown."""

from __future__ import annotations

import hashlib
import secrets

# Recognisable in logs and by secret scanners; not part of the secret.
TOKEN_MARKER = "tdm_"
# Shown in token lists: the marker and 8 characters (48 bits) of the secret.
PREFIX_LENGTH = len(TOKEN_MARKER) + 8


def token_generate() -> str:
    """A new raw token: the marker and 32 random bytes, URL-safe."""
    return TOKEN_MARKER + secrets.token_urlsafe(32)


def token_digest(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def token_prefix(raw: str) -> str:
    return raw[:PREFIX_LENGTH]
