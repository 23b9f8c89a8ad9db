"""Finding 10 of the security audit (brute force): failed logins are capped, and so is minting tokens.

Failed logins are counted in the shared cache (Redis), per user name and per client
address, for TANDEM_AUTH_FAILURE_WINDOW_S; past TANDEM_AUTH_FAILURES_ALLOWED the
login page answers 429. Minting API tokens is throttled per user (TANDEM_TOKEN_CREATE_RATE).
"""

from __future__ import annotations

import uuid

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.test import Client
from rest_framework.test import APIClient
from rest_framework.throttling import ScopedRateThrottle

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


def test_minting_api_tokens_is_throttled_per_user_and_listing_them_is_not(db, monkeypatch):
    monkeypatch.setitem(ScopedRateThrottle.THROTTLE_RATES, "token-create", "3/hour")
    erin, token = user_create_with_token(username=_name("erin"), password=None)
    frank, other = user_create_with_token(username=_name("frank"), password=None)
    for user in (erin, frank):  # user ids repeat across test databases; their counts must not
        cache.delete(ScopedRateThrottle.cache_format % {"scope": "token-create", "ident": user.pk})
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    for index in range(3):
        assert api.post("/api/tokens/", {"name": f"t{index}"}, format="json").status_code == 201
    refused = api.post("/api/tokens/", {"name": "one-too-many"}, format="json")
    assert refused.status_code == 429
    assert api.get("/api/tokens/").status_code == 200

    # Another user mints as usual: the count is per user.
    api.credentials(HTTP_AUTHORIZATION=f"Token {other}")
    assert api.post("/api/tokens/", {"name": "t"}, format="json").status_code == 201


def test_unknown_tokens_never_lock_out_a_valid_one_from_the_same_address(db):
    # Tokens hold 256 random bits: guessing is hopeless, and a lock-out per address would let
    # anyone behind the trainer's address lock the trainer out.
    _, token = user_create_with_token(username=_name("grace"), password=None)
    api = APIClient()
    for guess in range(5):
        assert api.get("/api/runs/", HTTP_AUTHORIZATION=f"Token wrong-{guess}",
                       REMOTE_ADDR=f"10.{RUN}.3.1").status_code == 401
    assert api.get("/api/runs/", HTTP_AUTHORIZATION=f"Token {token}",
                   REMOTE_ADDR=f"10.{RUN}.3.1").status_code == 200
