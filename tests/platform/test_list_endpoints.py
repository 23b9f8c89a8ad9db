"""Every list endpoint: paginated, filtered, ordered by named fields only, in a fixed number of queries."""

import io
import json
from datetime import timedelta

import pytest
from django.urls import get_resolver

from accounts.services import api_token_create, membership_add
from dataset_registry.services import dataset_upload, dataset_version_store
from environment_registry.builtin import CALCULATOR
from runs.models import Run
from tandem.contracts import TrainerStepEvent
from telemetry.services import metric_events_record

from .builders import step_event
from .route_walk import api_list_routes

DATASET_ROW = json.dumps({"messages": [{"role": "user", "content": "hi"},
                                       {"role": "assistant", "content": "hello"}]}).encode() + b"\n"


@pytest.fixture
def many(make_user, make_project, make_environment, make_run, user, project, environment):
    """``add(n)`` gives alice n more of everything a list shows: projects, members, runs, tokens."""
    serial = iter(range(10**6))

    def add(count: int) -> None:
        for _ in range(count):
            index = next(serial)
            other = make_project(owner=make_user(), name=f"shared-{index}", members=[user])
            make_run(other, environment=make_environment(other))
            make_run(project, environment=environment)
            make_project(owner=user, members=[make_user()], viewers=[make_user()])
            membership_add(project=project, user=make_user(), role="viewer")
            make_environment(project, CALCULATOR.model_copy(update={"name": f"calc-{index}"}))
            api_token_create(user=user, name=f"token-{index}")
            version = dataset_upload(user=user, project=project, name=f"rows-{index}", file_name="rows.jsonl",
                                     file=io.BytesIO(DATASET_ROW))
            dataset_version_store(version_id=version.pk)  # the datasets worker's part

    return add


def _list_paths(project):
    return [
        "/api/projects/",
        "/api/environments/",
        f"/api/environments/?project={project.pk}",
        "/api/runs/",
        f"/api/runs/?project={project.pk}&status=queued",
        f"/api/projects/{project.pk}/members/",
        "/api/tokens/",
        "/api/datasets/",
    ]


# Per list: authentication (1: the token with its user), any ?project= or path project
# check (1), then the page's count and rows (2); related objects come in the same rows,
# except environments' versions (1 prefetch for the whole page).
EXPECTED_QUERIES = {
    "/api/projects/": 3,
    "/api/environments/": 4,
    "/api/environments/?project={}": 5,
    # Runs' attempts: 1 prefetch for the whole page.
    "/api/runs/": 4,
    "/api/runs/?project={}&status=queued": 5,
    "/api/projects/{}/members/": 4,
    "/api/tokens/": 3,
    "/api/datasets/": 4,  # and 1 prefetch of the datasets' versions
}


@pytest.mark.parametrize("count", [1, 12])
def test_each_list_takes_a_fixed_number_of_queries(
    api, project, many, count, django_assert_num_queries
):
    many(count)
    api.get("/api/projects/")  # records the token's last use, a write that happens once a minute
    for template, expected in EXPECTED_QUERIES.items():
        path = template.format(project.pk)
        with django_assert_num_queries(expected):
            response = api.get(path)
        assert response.status_code == 200, (path, response.json())
        assert response.json()["results"], path  # a page of rows, not an empty list


# Lists under a run, pinned by the tests of their own app.
PINNED_ELSEWHERE = {
    "/api/runs/<int:run_id>/trajectories/",  # test_trajectories_api.py
    "/api/runs/<int:run_id>/checkpoints/",  # test_checkpoints_api.py
    "/api/runs/<int:run_id>/evaluations/",  # test_evaluations_api.py
    "/api/runs/<int:run_id>/traces/",  # test_traces_api.py
    "/api/alert-rules/",  # test_alerts_api.py
    "/api/alert-rules/<int:rule_id>/deliveries/",  # test_alerts_api.py
    "/api/notifications/",  # test_alerts_api.py
    "/api/sweeps/",  # test_sweeps.py
    "/api/projects/<int:project_id>/views/",  # test_workspace.py
    "/api/projects/<int:project_id>/reports/",  # test_reports.py
}


def test_every_list_in_the_url_configuration_has_a_pinned_query_count():
    pinned = {
        template.split("?")[0].replace("{}", "<int:project_id>") for template in EXPECTED_QUERIES
    } | PINNED_ELSEWHERE
    listed = set(api_list_routes(get_resolver()))
    assert listed <= pinned, f"pin the query count of {sorted(listed - pinned)}"


def test_lists_are_paginated(api, project, many):
    many(5)
    for path in _list_paths(project):
        first = api.get(path + ("&" if "?" in path else "?") + "page_size=2").json()
        assert set(first) == {"count", "next", "previous", "results"}, path
        assert len(first["results"]) == 2 and first["next"] is not None, path


@pytest.mark.parametrize(
    "path",
    [
        "/api/projects/",
        "/api/environments/",
        "/api/runs/",
        "/api/projects/{}/members/",
        "/api/tokens/",
        "/api/datasets/",
    ],
)
def test_an_unknown_ordering_field_is_400_naming_it(api, project, path):
    response = api.get(path.format(project.pk) + "?ordering=-created_at,-password")

    assert response.status_code == 400
    error = response.json()["error"]
    assert list(error["fields"]) == ["ordering"]
    assert "'password'" in error["message"]


def test_runs_are_ordered_by_the_named_fields(api, project, environment, make_run):
    runs = [make_run(project, environment=environment, name=name) for name in ("b", "c", "a")]
    for offset, run in enumerate(runs):
        Run.objects.filter(pk=run.pk).update(created_at=run.created_at - timedelta(hours=offset))

    def names(query: str) -> list[str]:
        return [item["name"] for item in api.get(f"/api/runs/?{query}").json()["results"]]

    assert names("") == ["b", "c", "a"]  # newest first by default
    assert names("ordering=name") == ["a", "b", "c"]
    assert names("ordering=-name") == ["c", "b", "a"]
    assert names("ordering=created_at") == ["a", "c", "b"]
    assert names("ordering=status,-name") == ["c", "b", "a"]


def test_runs_filter_by_project_environment_and_name(
    api, project, environment, make_project, make_environment, make_run, user
):
    shared = make_project(members=[user])
    other_environment = make_environment(shared)
    mine = make_run(project, environment=environment, name="alpha-1")
    theirs = make_run(shared, environment=other_environment, name="beta-1")

    def ids(query: str) -> set[int]:
        return {item["id"] for item in api.get(f"/api/runs/?{query}").json()["results"]}

    assert ids(f"project={project.pk}") == {mine.pk}
    assert ids(f"project={shared.pk}") == {theirs.pk}
    assert ids("environment=calculator") == {mine.pk, theirs.pk}
    assert ids("name=beta") == {theirs.pk}
    assert api.get(f"/api/runs/?project={make_project().pk}").status_code == 404
    invalid = api.get("/api/runs/?project=abc")
    assert invalid.status_code == 400 and list(invalid.json()["error"]["fields"]) == ["project"]


def test_projects_filter_by_role_and_name(api, project, make_project, user):
    viewed = make_project(name="watched", viewers=[user])

    def ids(query: str) -> set[int]:
        return {item["id"] for item in api.get(f"/api/projects/?{query}").json()["results"]}

    assert ids("role=owner") == {project.pk}
    assert ids("role=viewer") == {viewed.pk}
    assert ids("name=WATCH") == {viewed.pk}
    response = api.get("/api/projects/?role=admin")
    assert response.status_code == 400 and list(response.json()["error"]["fields"]) == ["role"]


def test_members_and_tokens_filter_and_order(api, project, make_user, user):
    membership_add(project=project, user=make_user("zed"), role="viewer")
    membership_add(project=project, user=make_user("bob"), role="member")
    api_token_create(user=user, name="zz-laptop")

    members = api.get(f"/api/projects/{project.pk}/members/?ordering=-username").json()
    assert [m["username"] for m in members["results"]] == ["zed", "bob", "alice"]
    viewers = api.get(f"/api/projects/{project.pk}/members/?role=viewer").json()
    assert [m["username"] for m in viewers["results"]] == ["zed"]
    tokens = api.get("/api/tokens/?ordering=-name").json()
    assert [t["name"] for t in tokens["results"]] == ["zz-laptop", "default"]
    assert [t["name"] for t in api.get("/api/tokens/?name=lap").json()["results"]] == ["zz-laptop"]


def test_environments_filter_by_kind_and_name(api, project, environment):
    assert api.get("/api/environments/?kind=python&name=calc").json()["count"] == 1
    assert api.get("/api/environments/?name=chess").json()["count"] == 0
    response = api.get("/api/environments/?kind=docker")
    assert response.status_code == 400 and list(response.json()["error"]["fields"]) == ["kind"]


def test_the_metrics_cursor_takes_a_fixed_number_of_queries(
    api, running_run, django_assert_num_queries
):
    events = [TrainerStepEvent.model_validate(step_event(running_run.pk, s)) for s in range(1, 30)]
    metric_events_record(run=running_run, events=events)
    api.get("/api/projects/")  # records the token's last use first

    # The token with its user, the run (its project and environment joined), the points.
    with django_assert_num_queries(3):
        response = api.get(f"/api/runs/{running_run.pk}/metrics/?limit=100")
    assert len(response.json()["points"]) >= 90
