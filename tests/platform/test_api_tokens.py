"""Per-user API tokens: stored as hashes, shown once, revoked at once, over REST, WebSocket and the page."""

import hashlib
import re

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import Client
from rest_framework.test import APIClient

from accounts.models import ApiToken
from config.asgi import application


def _token_client(raw: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {raw}")
    return client


def test_creating_a_token_shows_its_value_once_and_stores_only_its_hash(api, user):
    response = api.post("/api/tokens/", {"name": "laptop"}, format="json")

    assert response.status_code == 201, response.json()
    body = response.json()
    raw = body["token"]
    assert raw.startswith("tdm_") and len(raw) > 40 and body["prefix"] == raw[:12]
    stored = ApiToken.objects.get(pk=body["id"])
    assert stored.digest == hashlib.sha256(raw.encode()).hexdigest()
    with connection.cursor() as cursor:  # the raw value is in no column of any row
        cursor.execute("SELECT * FROM accounts_apitoken")
        assert not any(raw in str(value) for row in cursor.fetchall() for value in row)
    listed = api.get("/api/tokens/").json()["results"]
    assert {item["name"] for item in listed} == {"default", "laptop"}
    assert all("token" not in item for item in listed)
    assert "token" not in api.get(f"/api/tokens/{body['id']}/").json()
    assert _token_client(raw).get("/api/projects/").status_code == 200


def test_a_revoked_token_is_refused_on_the_very_next_request(api, user):
    created = api.post("/api/tokens/", {"name": "ci"}, format="json").json()
    ci = _token_client(created["token"])
    assert ci.get("/api/runs/").status_code == 200

    assert api.delete(f"/api/tokens/{created['id']}/").status_code == 204

    response = ci.get("/api/runs/")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "authentication_failed"
    assert response.headers["WWW-Authenticate"] == "Token"
    assert api.get("/api/runs/").status_code == 200  # the user's other token still works


def test_a_token_may_revoke_itself(api, user):
    token_id = ApiToken.objects.get(user=user, name="default").pk

    assert api.delete(f"/api/tokens/{token_id}/").status_code == 204
    assert api.get("/api/tokens/").status_code == 401


def test_last_use_is_recorded(api, user):
    token = ApiToken.objects.get(user=user)
    assert token.last_used_at is None

    api.get("/api/projects/")

    token.refresh_from_db()
    assert token.last_used_at is not None
    listed = api.get("/api/tokens/").json()["results"][0]
    assert listed["last_used_at"] is not None


@pytest.mark.parametrize(
    "header", ["Token nonsense", "Token ", "Token a b", f"Token tdm_{'x' * 43}"]
)
def test_an_unknown_or_malformed_token_is_401(db, header):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)

    response = client.get("/api/projects/")

    assert response.status_code == 401
    assert set(response.json()["error"]) == {"code", "message", "fields"}


def test_an_inactive_users_token_is_refused(api, user):
    user.is_active = False
    user.save()

    assert api.get("/api/projects/").status_code == 401


def test_another_users_token_is_not_found(api, make_user):
    other = make_user()
    token_id = ApiToken.objects.get(user=other).pk

    assert api.get(f"/api/tokens/{token_id}/").status_code == 404
    assert api.delete(f"/api/tokens/{token_id}/").status_code == 404
    assert ApiToken.objects.filter(pk=token_id).exists()


def test_a_second_token_of_the_same_name_is_a_conflict_naming_the_field(api):
    response = api.post("/api/tokens/", {"name": "default"}, format="json")

    assert response.status_code == 409
    assert list(response.json()["error"]["fields"]) == ["name"]


def test_a_blank_name_is_400_naming_the_field(api):
    response = api.post("/api/tokens/", {"name": "  "}, format="json")

    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["name"]


@pytest.mark.django_db(transaction=True)
def test_the_migration_drops_drf_authtokens_raw_keys():
    executor = MigrationExecutor(connection)
    executor.migrate([("accounts", "0001_initial")])
    with connection.cursor() as cursor:  # DRF's table as an older Tandem left it
        cursor.execute(
            "CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, created timestamptz,"
            " user_id integer)"
        )
        cursor.execute("INSERT INTO authtoken_token VALUES ('raw-key', now(), 1)")
        cursor.execute(
            "INSERT INTO django_migrations (app, name, applied) VALUES"
            " ('authtoken', '0001_initial', now())"
        )

    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    try:
        executor.migrate([("accounts", "0002_api_tokens")])

        assert "authtoken_token" not in connection.introspection.table_names()
        assert "accounts_apitoken" in connection.introspection.table_names()
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM django_migrations WHERE app = 'authtoken'")
            assert cursor.fetchone() == (0,)
    finally:
        # Going back to accounts 0001 unapplied every migration built on later ones (the
        # datasets app's, say): the tests after this one need the whole schema back.
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes())


def test_a_session_write_without_a_csrf_token_is_refused(user):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(user)

    response = client.post("/api/tokens/", {"name": "from-browser"}, format="json")

    assert response.status_code == 403
    assert "CSRF" in response.json()["error"]["message"]
    assert not ApiToken.objects.filter(name="from-browser").exists()
    assert client.get("/api/tokens/").status_code == 200  # reads need no CSRF token

    csrf = _csrf_token_of(client)
    response = client.post(
        "/api/tokens/", {"name": "from-browser"}, format="json", HTTP_X_CSRFTOKEN=csrf
    )
    assert response.status_code == 201


def _csrf_token_of(client) -> str:
    html = client.get("/tokens/").content.decode()
    return re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html).group(1)


@pytest.mark.django_db(transaction=True)
def test_a_revoked_token_cannot_open_a_websocket(running_run, user, api):
    created = api.post("/api/tokens/", {"name": "socket"}, format="json").json()

    def connects() -> bool:
        async def scenario():
            communicator = WebsocketCommunicator(
                application,
                f"/ws/runs/{running_run.pk}/",
                headers=[
                    (b"host", b"testserver"),
                    (b"authorization", f"Token {created['token']}".encode()),
                ],
            )
            connected, _ = await communicator.connect(timeout=5)
            await communicator.disconnect(timeout=1 if connected else 0.1)
            return connected

        return async_to_sync(scenario)()

    assert connects()
    api.delete(f"/api/tokens/{created['id']}/")
    assert not connects()


def test_the_tokens_page_creates_shows_once_lists_and_revokes(user):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(user)
    page = browser.get("/tokens/")
    assert page.status_code == 200
    assert 'href="/tokens/"' in page.content.decode()  # linked from the nav

    created = browser.post(
        "/tokens/", {"name": "notebook", "csrfmiddlewaretoken": _csrf_token_of(browser)}
    )

    assert created.status_code == 200
    html = created.content.decode()
    raw = re.search(r'id="new-token-value">(tdm_[^<]+)<', html).group(1)
    token = ApiToken.objects.get(user=user, name="notebook")
    assert token.digest == hashlib.sha256(raw.encode()).hexdigest()
    assert _token_client(raw).get("/api/runs/").status_code == 200
    again = browser.get("/tokens/").content.decode()
    assert raw not in again and f"{token.prefix}…" in again and "notebook" in again

    revoked = browser.post(
        f"/tokens/{token.pk}/revoke/",
        {"csrfmiddlewaretoken": _csrf_token_of(browser), "confirmed": "yes"},
        follow=True,
    )
    assert "Token &#x27;notebook&#x27; revoked." in revoked.content.decode()
    assert _token_client(raw).get("/api/runs/").status_code == 401


def test_the_tokens_page_checks_its_csrf_token(user):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(user)
    token = ApiToken.objects.get(user=user)

    assert browser.post("/tokens/", {"name": "x"}).status_code == 403
    assert browser.post(f"/tokens/{token.pk}/revoke/").status_code == 403
    assert ApiToken.objects.filter(pk=token.pk).exists()
    assert not ApiToken.objects.filter(name="x").exists()


def test_the_tokens_page_shows_a_duplicate_name_by_its_field(user):
    browser = Client()
    browser.force_login(user)

    response = browser.post("/tokens/", {"name": "default"})

    assert response.status_code == 200
    assert "already have a token named" in response.content.decode()
    assert ApiToken.objects.filter(user=user).count() == 1


def test_another_users_token_cannot_be_revoked_from_the_page(user, make_user):
    browser = Client()
    browser.force_login(user)
    other_token = ApiToken.objects.get(user=make_user())

    assert browser.post(f"/tokens/{other_token.pk}/revoke/").status_code == 404
    assert ApiToken.objects.filter(pk=other_token.pk).exists()
