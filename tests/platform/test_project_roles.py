"""Owners, members and viewers: who may read, write, and manage a project's membership."""

import pytest
from django.test import Client
from rest_framework.test import APIClient

from accounts.models import Membership
from runs.models import Run


@pytest.fixture
def team(make_user, make_project, make_environment, make_run):
    """A project with an owner, a member and a viewer, an environment and a queued run."""
    owner, member, viewer = make_user("olivia"), make_user("mo"), make_user("vic")
    project = make_project(owner=owner, name="team", members=[member], viewers=[viewer])
    environment = make_environment(project)
    run = make_run(project, environment=environment)
    return {"project": project, "owner": owner, "member": member, "viewer": viewer, "run": run}


def _writes(team):
    """Every write the API has on a project's objects, as (method, path, body)."""
    project, run = team["project"], team["run"]
    return [
        ("post", "/api/runs/", {"project": project.pk, "environment": "calculator"}),
        ("post", f"/api/runs/{run.pk}/cancel/", None),
        (
            "post",
            "/api/environments/",
            {"project": project.pk, "name": "other", "entrypoint": "tests.workers.other:C"},
        ),
        ("post", f"/api/projects/{project.pk}/members/", {"username": "olivia", "role": "viewer"}),
        ("patch", f"/api/projects/{project.pk}/members/mo/", {"role": "viewer"}),
        ("delete", f"/api/projects/{project.pk}/members/mo/", None),
    ]


def test_a_viewer_reads_everything_and_changes_nothing(team, client_for):
    viewer = client_for(team["viewer"])
    project, run = team["project"], team["run"]
    for path in (
        f"/api/projects/{project.pk}/",
        f"/api/projects/{project.pk}/members/",
        f"/api/projects/{project.pk}/members/olivia/",
        f"/api/runs/{run.pk}/",
        f"/api/runs/{run.pk}/metrics/",
        f"/api/environments/?project={project.pk}",
        "/api/runs/",
    ):
        assert viewer.get(path).status_code == 200, path

    for method, path, body in _writes(team):
        response = getattr(viewer, method)(path, body, format="json")
        assert response.status_code == 403, (method, path, response.json())
        assert response.json()["error"]["code"] == "permission_denied"

    run = Run.objects.get(pk=run.pk)
    assert run.status == "queued" and Run.objects.count() == 1
    assert Membership.objects.get(project=project, user=team["member"]).role == "member"


def test_a_viewer_cannot_write_through_the_pages_either(team):
    browser = Client()
    browser.force_login(team["viewer"])
    project, run = team["project"], team["run"]

    started = browser.post("/runs/", {"project": project.pk, "environment": "calculator"})
    cancelled = browser.post(f"/runs/{run.pk}/cancel/")

    assert started.status_code == 403 and cancelled.status_code == 403
    assert Run.objects.get().status == "queued"
    page = browser.get(f"/runs/{run.pk}/")
    assert page.status_code == 200 and 'id="cancel-form"' not in page.content.decode()
    assert 'id="trace-form"' not in page.content.decode()  # tracing is a write as well
    owner = Client()
    owner.force_login(team["owner"])
    owner_page = owner.get(f"/runs/{run.pk}/").content.decode()
    assert 'id="cancel-form"' in owner_page and 'id="trace-form"' in owner_page


def test_a_member_starts_and_cancels_runs_but_does_not_manage_members(team, client_for):
    member = client_for(team["member"])
    project = team["project"]

    started = member.post(
        "/api/runs/", {"project": project.pk, "environment": "calculator"}, format="json"
    )
    assert started.status_code == 201
    assert member.post(f"/api/runs/{team['run'].pk}/cancel/").status_code == 200
    registered = member.post(
        "/api/environments/",
        {"project": project.pk, "name": "mine", "entrypoint": "tests.workers.other:C"},
        format="json",
    )
    assert registered.status_code == 201

    added = member.post(
        f"/api/projects/{project.pk}/members/", {"username": "olivia"}, format="json"
    )
    assert added.status_code == 403
    assert (
        member.patch(
            f"/api/projects/{project.pk}/members/vic/", {"role": "member"}, format="json"
        ).status_code
        == 403
    )
    assert member.delete(f"/api/projects/{project.pk}/members/vic/").status_code == 403


def test_an_owner_adds_changes_and_removes_members_by_username(team, client_for, make_user):
    owner = client_for(team["owner"])
    project = team["project"]
    newcomer = make_user("nina")
    members_url = f"/api/projects/{project.pk}/members/"

    added = owner.post(members_url, {"username": "nina", "role": "viewer"}, format="json")
    assert added.status_code == 201, added.json()
    assert added.json()["username"] == "nina" and added.json()["role"] == "viewer"
    assert client_for(newcomer).get(f"/api/projects/{project.pk}/").json()["role"] == "viewer"

    changed = owner.patch(f"{members_url}nina/", {"role": "member"}, format="json")
    assert changed.status_code == 200 and changed.json()["role"] == "member"
    started = client_for(newcomer).post(
        "/api/runs/", {"project": project.pk, "environment": "calculator"}, format="json"
    )
    assert started.status_code == 201

    assert owner.delete(f"{members_url}nina/").status_code == 204
    assert client_for(newcomer).get(f"/api/projects/{project.pk}/").status_code == 404
    listed = [(m["username"], m["role"]) for m in owner.get(members_url).json()["results"]]
    assert listed == [("mo", "member"), ("olivia", "owner"), ("vic", "viewer")]


def test_adding_a_member_names_the_bad_field(team, client_for):
    owner = client_for(team["owner"])
    url = f"/api/projects/{team['project'].pk}/members/"

    unknown_user = owner.post(url, {"username": "nobody"}, format="json")
    unknown_role = owner.post(url, {"username": "mo", "role": "admin"}, format="json")
    already = owner.post(url, {"username": "mo"}, format="json")

    assert unknown_user.status_code == 400
    assert list(unknown_user.json()["error"]["fields"]) == ["username"]
    assert unknown_role.status_code == 400
    assert list(unknown_role.json()["error"]["fields"]) == ["role"]
    assert already.status_code == 409
    assert list(already.json()["error"]["fields"]) == ["username"]


def test_the_last_owner_can_be_neither_demoted_nor_removed(team, client_for):
    owner = client_for(team["owner"])
    url = f"/api/projects/{team['project'].pk}/members/"

    demoted = owner.patch(f"{url}olivia/", {"role": "member"}, format="json")
    removed = owner.delete(f"{url}olivia/")

    assert demoted.status_code == 409 and removed.status_code == 409
    assert list(demoted.json()["error"]["fields"]) == ["role"]

    owner.patch(f"{url}mo/", {"role": "owner"}, format="json")
    assert owner.patch(f"{url}olivia/", {"role": "viewer"}, format="json").status_code == 200
    assert client_for(team["member"]).delete(f"{url}olivia/").status_code == 204


def test_a_removed_member_loses_access_at_once(team, client_for):
    member = client_for(team["member"])
    assert member.get(f"/api/runs/{team['run'].pk}/").status_code == 200

    client_for(team["owner"]).delete(f"/api/projects/{team['project'].pk}/members/mo/")

    assert member.get(f"/api/runs/{team['run'].pk}/").status_code == 404
    assert member.get("/api/runs/").json()["count"] == 0


def test_an_unknown_member_is_404(team, client_for):
    owner = client_for(team["owner"])

    response = owner.get(f"/api/projects/{team['project'].pk}/members/nobody/")

    assert response.status_code == 404


def test_a_session_write_without_a_csrf_token_is_refused(team):
    browser = APIClient(enforce_csrf_checks=True)
    browser.force_login(team["owner"])

    response = browser.post(f"/api/runs/{team['run'].pk}/cancel/", format="json")

    assert response.status_code == 403
    assert Run.objects.get().status == "queued"
