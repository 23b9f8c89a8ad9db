"""``Authorization: Token <value>`` for scripts, the CLI and the trainer.

Tokens are looked up by the hash of the presented value (accounts.tokens), so a
revoked token, being deleted, is refused on the very next request.
"""

from __future__ import annotations

from django.contrib.auth.models import AbstractBaseUser
from rest_framework import authentication, exceptions

from .models import ApiToken
from .selectors import api_token_authenticate
from .services import api_token_mark_used

KEYWORD = "Token"


def token_from_header(value: str) -> str | None:
    """The raw token of an ``Authorization`` header value, or None if it is not ours."""
    scheme, _, raw = value.partition(" ")
    if scheme.lower() != KEYWORD.lower():
        return None
    return raw.strip()


def token_user(raw: str) -> tuple[AbstractBaseUser, ApiToken] | None:
    """The active user ``raw`` authenticates, and its token; records the use."""
    token = api_token_authenticate(raw=raw)
    if token is None:
        return None
    api_token_mark_used(token=token)
    return token.user, token


class ApiTokenAuthentication(authentication.BaseAuthentication):
    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        raw = token_from_header(header)
        if raw is None:
            return None  # not a token request: session authentication may take it
        if not raw or " " in raw:
            raise exceptions.AuthenticationFailed("Malformed token header: 'Token <value>'.")
        # No lock-out per address here: a token has 256 random bits, so guessing one is hopeless,
        # while refusing an address would let anyone sharing it (a NAT, the trainer's host) lock
        # out every valid token there. Passwords are what get guessed (accounts.pages).
        found = token_user(raw)
        if found is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked token.")
        return found

    def authenticate_header(self, request) -> str:
        # Makes DRF answer 401 (with this challenge), not 403, to unauthenticated calls.
        return KEYWORD
