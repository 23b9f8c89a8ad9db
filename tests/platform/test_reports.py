"""Reports: markdown by a project's writers with its saved views embedded, read by its members and never by
anyone else, through the API and the pages, against a real PostgreSQL."""

from __future__ import annotations

import pytest
from django.test import Client

from accounts.models import Membership
from accounts.services import membership_add
from workspaces.report_body import report_blocks
from workspaces.services import report_create, saved_view_save

pytestmark = pytest.mark.django_db


@pytest.fixture
def team(make_user, project):
    """A member who writes, a viewer who reads, and an outsider with a project of their own."""
    member, viewer, outsider = make_user("bob"), make_user("carol"), make_user("mallory")
    membership_add(project=project, user=member, role=Membership.Role.MEMBER)
    membership_add(project=project, user=viewer, role=Membership.Role.VIEWER)
    return member, viewer, outsider


def _signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_members_write_and_read_reports_and_outsiders_reach_none_of_them(client_for, project, team):
    member, viewer, outsider = team
    saved_view_save(user=project.owner, project=project, name="by tag", query="g=tag")
    written = client_for(member).post(f"/api/projects/{project.pk}/reports/", {
        "title": "Sweep results", "body": "Runs by tag:\n\n{{view: by tag}}\n"}, format="json")
    assert written.status_code == 201, written.content
    report_id = written.json()["id"]
    api_path = f"/api/projects/{project.pk}/reports/{report_id}/"
    page_path = f"/projects/{project.pk}/reports/{report_id}/"

    read = client_for(viewer).get(api_path)
    assert read.status_code == 200
    assert read.json()["views"] == [{"name": "by tag", "id": read.json()["views"][0]["id"], "query": "g=tag"}]
    assert "Sweep results" in _signed_in(viewer).get(page_path).content.decode()
    # Viewers read only; writers change.
    assert client_for(viewer).patch(api_path, {"title": "mine now"}, format="json").status_code == 403
    assert _signed_in(viewer).get(f"{page_path}edit/").status_code == 403
    assert client_for(project.owner).patch(api_path, {"body": "new"}, format="json").json()["body"] == "new"

    # An outsider: every route says there is no such report, and the list holds none.
    stranger = client_for(outsider)
    for method, path in [("get", api_path), ("patch", api_path), ("delete", api_path),
                         ("get", f"/api/projects/{project.pk}/reports/")]:
        answer = getattr(stranger, method)(path, {"title": "x"}, format="json") if method == "patch" else \
            getattr(stranger, method)(path)
        assert answer.status_code == 404, (method, path, answer.status_code)
    browser = _signed_in(outsider)
    for path in (page_path, f"{page_path}edit/", f"/projects/{project.pk}/reports/",
                 f"/projects/{project.pk}/workspace/"):
        assert browser.get(path).status_code == 404, path
    assert browser.post(f"{page_path}delete/").status_code == 404
    # Their own project's route to our report is no way in either.
    theirs = report_create(user=outsider, project=_own_project(outsider), title="theirs", body="")
    assert stranger.get(f"/api/projects/{theirs.project_id}/reports/{report_id}/").status_code == 404
    assert client_for(member).get(f"/api/projects/{project.pk}/reports/{theirs.pk}/").status_code == 404


def _own_project(user):
    from accounts.services import project_create

    return project_create(owner=user, name="elsewhere")


def test_a_report_embeds_views_of_its_own_project_only_and_never_runs_its_html(project, make_user):
    outsider = make_user()
    other = _own_project(outsider)
    saved_view_save(user=outsider, project=other, name="secret runs", query="q=secret")
    saved_view_save(user=project.owner, project=project, name="ours", query="m=loss")
    blocks = report_blocks(project=project, body=(
        "<img src=x onerror=alert(1)> [link](javascript:alert(1))\n\n{{view: secret runs}}\n{{ view: ours }}\n"))
    text, secret, ours = blocks
    assert "<img" not in text.html and "&lt;img" in text.html  # shown as text
    assert "<a" not in text.html and 'href="javascript' not in text.html  # a script URL is never a link
    assert secret.view_name == "secret runs" and secret.view_id is None and secret.view_query == ""
    assert ours.view_id is not None and ours.view_query == "m=loss"


def test_a_report_names_the_field_it_refuses(client_for, project):
    api = client_for(project.owner)
    blank = api.post(f"/api/projects/{project.pk}/reports/", {"title": "  ", "body": ""}, format="json")
    assert blank.status_code == 400 and "title" in blank.json()["error"]["fields"]
    huge = api.post(f"/api/projects/{project.pk}/reports/", {"title": "big", "body": "x" * 100_001}, format="json")
    assert huge.status_code == 400 and "body" in huge.json()["error"]["fields"]


@pytest.mark.parametrize("reports", [1, 12])
def test_the_report_list_takes_a_fixed_number_of_queries(client_for, project, reports, django_assert_num_queries):
    for index in range(reports):
        report_create(user=project.owner, project=project, title=f"report {index}", body="text")
    api = client_for(project.owner)
    api.get("/api/projects/")  # records the token's last use, a write that happens once a minute

    # The token with its user, the project with the caller's role, the page's count and its rows.
    with django_assert_num_queries(4):
        listed = api.get(f"/api/projects/{project.pk}/reports/").json()
    assert len(listed["results"]) == reports


def test_the_report_pages_write_edit_and_delete_a_report(project):
    saved_view_save(user=project.owner, project=project, name="by tag", query="g=tag")
    browser = _signed_in(project.owner)
    listed = browser.get(f"/projects/{project.pk}/reports/").content.decode()
    assert "{{view: by tag}}" in listed  # the form lists the views a line can embed
    written = browser.post(f"/projects/{project.pk}/reports/", {"title": "Notes", "body": "*first*"})
    assert written.status_code == 302
    report_path = written["Location"]
    assert "<em>first</em>" in browser.get(report_path).content.decode()
    assert browser.post(f"{report_path}edit/", {"title": "Notes", "body": "**second**"}).status_code == 302
    assert "<strong>second</strong>" in browser.get(report_path).content.decode()
    refused = browser.post(f"/projects/{project.pk}/reports/", {"title": "", "body": ""})
    assert refused.status_code == 200 and "This field is required" in refused.content.decode()
    assert browser.post(f"{report_path}delete/").status_code == 302
    assert browser.get(report_path).status_code == 404
