"""Password logins, counted on every path that checks one: the dashboard's, the admin's, any other.

Each of them calls ``django.contrib.auth.authenticate``, which calls this backend, so they
share one counter and one lock-out (``TANDEM_AUTH_FAILURES_ALLOWED`` per user name and per
client address within ``TANDEM_AUTH_FAILURE_WINDOW_S``). Counting in a login view instead
missed the admin's login, and would miss the next login path someone adds.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import PermissionDenied

from .selectors import auth_locked_out
from .services import auth_failure_record, auth_failures_clear


class LockingModelBackend(ModelBackend):
    """ModelBackend that refuses a locked-out user name or address, and counts each wrong password."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if username is None:
            username = kwargs.get(get_user_model().USERNAME_FIELD)
        address = request.META.get("REMOTE_ADDR") if request is not None else None
        if auth_locked_out(username=username, address=address):
            # PermissionDenied, not None: authenticate() then tries no other backend.
            raise PermissionDenied("Too many failed logins; try again later.")
        user = super().authenticate(request, username=username, password=password, **kwargs)
        if user is None:
            auth_failure_record(username=username, address=address)
        else:
            auth_failures_clear(username=user.get_username())
        return user
