"""The alerts API and pages: rules per project for its writers, notifications per user, the badge."""

from __future__ import annotations

import pytest
from django.test import Client

from accounts.services import membership_add
from alerts.models import AlertRule, Notification
from runs.services import run_transition
from tandem.contracts import RunStatus

from .test_alerts_webhooks import eager_tasks  # noqa: F401 - the fixture

SECRET = "s3cret-signing-key-never-shown"


@pytest.fixture(autouse=True)
def webhooks_to_localhost(settings):
    settings.TANDEM_WEBHOOK_ALLOWED_HOSTS = ["127.0.0.1"]


def _create(api, project, **overrides):
    body = {"project": project.pk, "name": "reward collapse", "kind": "metric_threshold",
            "metric": "reward_mean", "comparison": "below", "threshold": 0.1, "steps": 5,
            "webhook_url": "http://127.0.0.1:9/hook", "webhook_secret": SECRET, **overrides}
    return api.post("/api/alert-rules/", body, format="json")


def test_a_writer_creates_reads_changes_and_deletes_a_rule_and_never_sees_the_secret(api, project):
    created = _create(api, project)
    assert created.status_code == 201, created.json()
    rule = created.json()
    assert rule["kind"] == "metric_threshold" and rule["steps"] == 5 and rule["webhook_secret_set"] is True
    assert "webhook_secret" not in rule

    responses = [
        api.get("/api/alert-rules/"),
        api.get(f"/api/alert-rules/?project={project.pk}&kind=metric_threshold"),
        api.get(f"/api/alert-rules/{rule['id']}/"),
        api.patch(f"/api/alert-rules/{rule['id']}/", {"threshold": 0.2, "name": "collapse"}, format="json"),
        api.get(f"/api/alert-rules/{rule['id']}/deliveries/"),
        api.get("/api/schema/"),
    ]
    for response in [created, *responses]:
        assert response.status_code == 200 or response.status_code == 201, response.content[:300]
        assert SECRET not in response.content.decode()
    # The project's own rule, and the tools_unused rule every project starts with.
    assert responses[0].json()["count"] == 2 and responses[1].json()["count"] == 1
    changed = responses[3].json()
    assert (changed["threshold"], changed["name"], changed["webhook_secret_set"]) == (0.2, "collapse", True)
    assert AlertRule.objects.get(pk=rule["id"]).webhook_secret == SECRET  # kept: left out of the PATCH

    assert api.delete(f"/api/alert-rules/{rule['id']}/").status_code == 204
    assert api.get(f"/api/alert-rules/{rule['id']}/").status_code == 404


@pytest.mark.parametrize("url", ["http://10.0.0.5/hook", "http://169.254.169.254/latest", "ftp://127.0.0.1/x",
                                 "http://localhost.invalid/hook"])
def test_a_webhook_url_off_the_allow_list_is_a_400_naming_the_field(api, project, url):
    response = _create(api, project, webhook_url=url)

    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["webhook_url"]
    assert SECRET not in response.content.decode()


def test_without_an_operator_allow_list_no_webhook_url_is_allowed(api, project, settings):
    settings.TANDEM_WEBHOOK_ALLOWED_HOSTS = []
    response = _create(api, project)

    assert response.status_code == 400
    assert "TANDEM_WEBHOOK_ALLOWED_HOSTS" in response.json()["error"]["fields"]["webhook_url"][0]


@pytest.mark.parametrize(("overrides", "field"), [
    ({"metric": ""}, "metric"),
    ({"steps": None}, "steps"),
    ({"comparison": "sideways"}, "comparison"),
    ({"kind": "run_failed"}, "metric"),  # a setting the kind does not use
    ({"kind": "trainer_idle", "metric": "", "comparison": "", "steps": None, "threshold": 1.5, "minutes": 5},
     "threshold"),
    ({"kind": "no_progress", "metric": "", "comparison": "", "steps": None, "threshold": None}, "minutes"),
    ({"webhook_secret": ""}, "webhook_secret"),
    ({"colour": "red"}, "colour"),
])
def test_a_rule_missing_what_its_kind_needs_is_a_400_naming_the_field(api, project, overrides, field):
    response = _create(api, project, **overrides)

    assert response.status_code == 400, response.json()
    assert field in response.json()["error"]["fields"]


def test_a_duplicate_name_is_a_409(api, project):
    assert _create(api, project).status_code == 201
    assert _create(api, project).status_code == 409


def test_a_viewer_reads_rules_but_cannot_write_them(api, project, make_user, client_for):
    viewer = make_user()
    membership_add(project=project, user=viewer, role="viewer")
    rule = _create(api, project).json()
    as_viewer = client_for(viewer)

    assert as_viewer.get(f"/api/alert-rules/{rule['id']}/").status_code == 200
    assert _create(as_viewer, project, name="mine").status_code == 403
    assert as_viewer.patch(f"/api/alert-rules/{rule['id']}/", {"enabled": False}, format="json").status_code == 403
    assert as_viewer.delete(f"/api/alert-rules/{rule['id']}/").status_code == 403


def test_another_projects_user_can_neither_see_nor_change_a_rule(api, project, make_user, make_project, client_for):
    rule = _create(api, project).json()
    outsider = make_user()
    make_project(owner=outsider)
    theirs = client_for(outsider)

    assert [row["project"] for row in theirs.get("/api/alert-rules/").json()["results"]] == \
        [AlertRule.objects.get(project__owner=outsider).project_id]  # only their project's default rule
    assert theirs.get(f"/api/alert-rules/?project={project.pk}").status_code == 404
    for method in ("get", "patch", "delete"):
        assert getattr(theirs, method)(f"/api/alert-rules/{rule['id']}/", {}, format="json").status_code == 404
    assert theirs.get(f"/api/alert-rules/{rule['id']}/deliveries/").status_code == 404
    assert _create(theirs, project, name="sneaky").status_code == 404
    assert AlertRule.objects.get(pk=rule["id"]).name == "reward collapse"


def test_a_firing_shows_as_a_notification_with_the_badge_count_until_read(
    api, project, running_run, user, django_capture_on_commit_callbacks, make_user, client_for
):
    _create(api, project, kind="run_failed", metric="", comparison="", threshold=None, steps=None,
            webhook_url="", webhook_secret="")
    with django_capture_on_commit_callbacks(execute=True):
        run_transition(run=running_run, to_status=RunStatus.FAILED, reason="CheckpointError: disk full")
    browser = Client()
    browser.force_login(user)

    assert api.get("/api/notifications/unread-count/").json() == {"unread": 1}
    [notification] = api.get("/api/notifications/?unread=true").json()["results"]
    assert notification["kind"] == "run_failed" and notification["run"] == running_run.pk
    assert "CheckpointError: disk full" in notification["text"] and notification["read_at"] is None
    page = browser.get("/runs/").content.decode()
    assert 'id="notification-badge"' in page and ">1</span>" in page
    listing = browser.get("/notifications/").content.decode()
    assert "CheckpointError: disk full" in listing and "notification-unread" in listing

    # Someone else's notifications are not theirs to read or mark.
    stranger = client_for(make_user())
    assert stranger.post(f"/api/notifications/{notification['id']}/read/").status_code == 404
    assert stranger.get("/api/notifications/").json()["count"] == 0

    read = api.post(f"/api/notifications/{notification['id']}/read/").json()
    assert read["read_at"] is not None
    assert api.get("/api/notifications/unread-count/").json() == {"unread": 0}
    assert 'id="notification-badge"' not in browser.get("/runs/").content.decode()


def test_mark_all_read_from_the_page(user, project, running_run, api, django_capture_on_commit_callbacks):
    _create(api, project, kind="run_failed", metric="", comparison="", threshold=None, steps=None,
            webhook_url="", webhook_secret="")
    with django_capture_on_commit_callbacks(execute=True):
        run_transition(run=running_run, to_status=RunStatus.FAILED, reason="boom")
    browser = Client()
    browser.force_login(user)

    assert browser.post("/notifications/read-all/").status_code == 302
    assert not Notification.objects.filter(user=user, read_at__isnull=True).exists()
    assert api.post("/api/notifications/read-all/").json() == {"marked": 0}


def test_the_rules_page_creates_a_rule_and_names_the_field_it_refuses(user, project):
    browser = Client()
    browser.force_login(user)
    form = {"project": project.pk, "name": "failures", "kind": "run_failed"}

    assert browser.post("/alerts/", form).status_code == 302
    page = browser.get("/alerts/").content.decode()
    assert "failures" in page and "Run failed" in page

    refused = browser.post("/alerts/", {**form, "name": "hooked", "webhook_url": "http://10.1.2.3/x",
                                        "webhook_secret": SECRET}).content.decode()
    assert "not on TANDEM_WEBHOOK_ALLOWED_HOSTS" in refused and SECRET not in refused
    assert not AlertRule.objects.filter(name="hooked").exists()


@pytest.mark.parametrize("count", [1, 8])
def test_the_alert_lists_take_a_fixed_number_of_queries(
    api, project, user, running_run, count, django_assert_num_queries, django_capture_on_commit_callbacks,
    eager_tasks, settings,  # noqa: F811
):
    settings.TANDEM_WEBHOOK_MAX_ATTEMPTS = 2  # to port 9, where nothing listens: each delivery fails twice
    for index in range(count):
        rule = _create(api, project, name=f"rule {index}", kind="run_failed", metric="", comparison="",
                       threshold=None, steps=None).json()
    with django_capture_on_commit_callbacks(execute=True):
        run_transition(run=running_run, to_status=RunStatus.FAILED, reason="boom")
    api.get("/api/projects/")  # records the token's last use, a write that happens once a minute

    # Authentication (1), the count and the page (2); deliveries: the rule (1) and their attempts (1).
    for path, queries in (("/api/alert-rules/", 3), ("/api/notifications/", 3),
                          (f"/api/alert-rules/{rule['id']}/deliveries/", 5)):
        with django_assert_num_queries(queries):
            response = api.get(path)
        assert response.status_code == 200 and response.json()["results"], path
