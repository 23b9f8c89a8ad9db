import pytest

from environments.models import Environment


def _register(api, **overrides):
    payload = {
        "name": "maze",
        "kind": "python",
        "entrypoint": "workers.environments.maze:MazeEnvironment",
        "params": {"size": 5},
    }
    payload.update(overrides)
    return api.post("/api/environments/", payload, format="json")


def test_registering_an_environment_stores_its_spec(api, project):
    response = _register(api, project=project.pk)

    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["project"] == project.pk
    assert body["entrypoint"] == "workers.environments.maze:MazeEnvironment"
    assert Environment.objects.get(pk=body["id"]).to_spec().params == {"size": 5}


@pytest.mark.parametrize(
    "entrypoint",
    [
        "workers.environments.maze",
        "workers/maze:Maze",
        "maze:",
        ":Maze",
        "a:b:c",
        "1maze:Maze",
        "maze: Maze",
    ],
)
def test_a_malformed_entrypoint_is_400_naming_entrypoint(api, project, entrypoint):
    response = _register(api, project=project.pk, entrypoint=entrypoint)

    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["entrypoint"]


def test_an_unknown_kind_is_400_naming_kind(api, project):
    response = _register(api, project=project.pk, kind="docker")

    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["kind"]


def test_params_must_be_an_object(api, project):
    response = _register(api, project=project.pk, params=[1, 2])

    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == ["params"]


def test_a_name_taken_in_the_project_is_a_conflict_naming_name(api, project, environment):
    response = _register(api, project=project.pk, name=environment.name)

    assert response.status_code == 409
    assert list(response.json()["error"]["fields"]) == ["name"]


def test_the_same_name_is_free_in_another_project(api, project, environment, make_project, user):
    other = make_project(owner=user)

    response = _register(api, project=other.pk, name=environment.name)

    assert response.status_code == 201


def test_a_viewer_may_not_register_environments(client_for, make_user, make_project):
    viewer = make_user()
    project = make_project(viewers=[viewer])

    response = _register(client_for(viewer), project=project.pk)

    assert response.status_code == 403
    assert response.json()["error"]["code"] == "permission_denied"


def test_another_users_project_is_not_found(api, make_project):
    response = _register(api, project=make_project().pk)

    assert response.status_code == 404


def test_listing_shows_the_environments_of_the_users_projects(
    api, project, environment, make_project, make_environment, user
):
    make_environment(make_project())  # someone else's
    other = make_project(owner=user)
    in_other = make_environment(other)

    everything = api.get("/api/environments/").json()["results"]
    only_other = api.get(f"/api/environments/?project={other.pk}").json()["results"]

    assert {item["id"] for item in everything} == {environment.pk, in_other.pk}
    assert [item["id"] for item in only_other] == [in_other.pk]


def test_listing_a_project_of_someone_else_is_not_found(api, make_project):
    assert api.get(f"/api/environments/?project={make_project().pk}").status_code == 404
    assert api.get("/api/environments/?project=abc").status_code == 400
