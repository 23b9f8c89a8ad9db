"""Finding 10 of the security audit (brute force): failed logins and unknown tokens are counted and capped.

Counters live in the shared cache (Redis), per user name and per client address,
for TANDEM_AUTH_FAILURE_WINDOW_S; past TANDEM_AUTH_FAILURES_ALLOWED the login page
and token requests answer 429.
"""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.test import APIClient

from accounts.services import user_create_with_token

# Counters outlive a test (they expire with their window) and the cache is shared with the
# suite's Redis, which a test must not flush: each run uses names and addresses of its own.
RUN = uuid.uuid4().int % 200 + 10


@pytest.fixture(autouse=True)
def small_limit(settings):
    settings.TANDEM_AUTH_FAILURES_ALLOWED = 3


def _name(base: str) -> str:
    return f"{base}-{uuid.uuid4().hex[:8]}"


def _login(client: Client, username: str, password: str, address: str):
    return client.post("/login/", {"username": username, "password": password}, REMOTE_ADDR=address)


def test_a_user_name_that_failed_too_often_cannot_log_in_even_with_its_password(db):
    alice, bob = _name("alice"), _name("bob")
    get_user_model().objects.create_user(username=alice, password="right-password")
    client = Client()
    for attempt in range(3):  # from different addresses: the user name's counter adds up
        assert _login(client, alice, "guess", f"10.{RUN}.0.{attempt}").status_code == 200

    locked = _login(client, alice, "right-password", f"10.{RUN}.0.9")
    assert locked.status_code == 429
    assert "_auth_user_id" not in client.session
    # Another user is not locked out by alice's failures.
    get_user_model().objects.create_user(username=bob, password="bobs-password")
    assert _login(Client(), bob, "bobs-password", f"10.{RUN}.1.1").status_code == 302


def test_an_address_that_failed_too_often_is_refused_for_every_user_name(db):
    carol = _name("carol")
    get_user_model().objects.create_user(username=carol, password="carols-password")
    client = Client()
    for _ in range(3):
        _login(client, _name("guess"), "guess", f"10.{RUN}.2.1")
    assert _login(client, carol, "carols-password", f"10.{RUN}.2.1").status_code == 429
    assert _login(client, carol, "carols-password", f"10.{RUN}.2.2").status_code == 302


def test_an_address_guessing_tokens_gets_429_even_for_a_valid_one(db):
    _, token = user_create_with_token(username=_name("dave"), password=None)
    api = APIClient()
    guesser, other = f"10.{RUN}.3.1", f"10.{RUN}.3.2"
    for guess in range(3):
        response = api.get("/api/runs/", HTTP_AUTHORIZATION=f"Token wrong-{guess}", REMOTE_ADDR=guesser)
        assert response.status_code == 401
    refused = api.get("/api/runs/", HTTP_AUTHORIZATION=f"Token {token}", REMOTE_ADDR=guesser)
    assert refused.status_code == 429
    allowed = api.get("/api/runs/", HTTP_AUTHORIZATION=f"Token {token}", REMOTE_ADDR=other)
    assert allowed.status_code == 200
