"""Issue 28, finding 6: one failed-login counter and one lock-out for every password login.

Before, only the dashboard's login view counted failures: twelve wrong passwords on
``/admin/login/`` left no count, and the thirteenth, right, logged a locked-out staff user in.
Now the authentication backend (accounts.backends) counts and refuses, so every path that
checks a password through ``django.contrib.auth.authenticate`` shares the counter. The API
takes no passwords (token and session authentication only; tests/platform/test_security_throttling.py).
"""

from __future__ import annotations

import uuid

import pytest
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.test import Client

# Counters live in the shared Redis for their window: names and addresses of this run only.
RUN = uuid.uuid4().int % 200 + 10
ALLOWED = 3


@pytest.fixture(autouse=True)
def small_limit(settings):
    settings.TANDEM_AUTH_FAILURES_ALLOWED = ALLOWED


def _staff_user(base: str) -> str:
    username = f"{base}-{uuid.uuid4().hex[:8]}"
    get_user_model().objects.create_user(username=username, password="right-password", is_staff=True)
    return username


def _admin_login(client: Client, username: str, password: str, address: str):
    return client.post("/admin/login/", {"username": username, "password": password, "next": "/admin/"},
                       REMOTE_ADDR=address)


def _dashboard_login(client: Client, username: str, password: str, address: str):
    return client.post("/login/", {"username": username, "password": password}, REMOTE_ADDR=address)


def test_the_admin_login_locks_out_a_user_name_after_the_allowed_failures(db):
    staff = _staff_user("staff")
    for attempt in range(ALLOWED):  # from different addresses: the user name's counter adds up
        refused = _admin_login(Client(), staff, "guess", f"10.{RUN}.10.{attempt}")
        assert refused.status_code == 200 and "_auth_user_id" not in refused.wsgi_request.session

    client = Client()
    locked = _admin_login(client, staff, "right-password", f"10.{RUN}.10.99")

    assert "_auth_user_id" not in client.session, "the admin login let a locked-out user in"
    assert locked.status_code == 200
    assert client.get("/admin/").status_code == 302  # still sent to the login page


def test_failures_on_the_dashboard_login_lock_the_admin_login_and_back(db):
    alice, bob = _staff_user("alice"), _staff_user("bob")
    _dashboard_login(Client(), alice, "guess", f"10.{RUN}.11.1")
    _admin_login(Client(), alice, "guess", f"10.{RUN}.11.2")
    _dashboard_login(Client(), alice, "guess", f"10.{RUN}.11.3")
    # Three failures on two paths: both are locked now.
    admin = Client()
    _admin_login(admin, alice, "right-password", f"10.{RUN}.11.4")
    assert "_auth_user_id" not in admin.session
    assert _dashboard_login(Client(), alice, "right-password", f"10.{RUN}.11.5").status_code == 429

    for attempt in range(ALLOWED):
        _admin_login(Client(), bob, "guess", f"10.{RUN}.12.{attempt}")
    dashboard = Client()
    assert _dashboard_login(dashboard, bob, "right-password", f"10.{RUN}.12.9").status_code == 429
    assert "_auth_user_id" not in dashboard.session


def test_an_address_that_failed_on_the_admin_login_is_refused_on_the_dashboard(db):
    carol = _staff_user("carol")
    for attempt in range(ALLOWED):
        _admin_login(Client(), f"nobody-{attempt}-{RUN}", "guess", f"10.{RUN}.13.1")

    assert _dashboard_login(Client(), carol, "right-password", f"10.{RUN}.13.1").status_code == 429
    assert _dashboard_login(Client(), carol, "right-password", f"10.{RUN}.13.2").status_code == 302


def test_a_right_password_before_the_limit_clears_the_user_names_count(db):
    dana = _staff_user("dana")
    for attempt in range(ALLOWED - 1):
        _admin_login(Client(), dana, "guess", f"10.{RUN}.14.{attempt}")
    admin = Client()
    _admin_login(admin, dana, "right-password", f"10.{RUN}.14.8")
    assert "_auth_user_id" in admin.session

    for attempt in range(ALLOWED - 1):  # counted from zero again
        _admin_login(Client(), dana, "guess", f"10.{RUN}.15.{attempt}")
    assert _dashboard_login(Client(), dana, "right-password", f"10.{RUN}.15.9").status_code == 302


def test_every_password_login_goes_through_the_counting_backend():
    assert django_settings.AUTHENTICATION_BACKENDS == ["accounts.backends.LockingModelBackend"]
