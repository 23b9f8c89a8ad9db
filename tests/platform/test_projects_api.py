from accounts.models import Membership


def test_a_user_lists_only_the_projects_they_belong_to(api, project, make_project, user):
    make_project()  # someone else's
    shared = make_project(members=[user])

    response = api.get("/api/projects/")

    assert response.status_code == 200
    listed = {(item["id"], item["role"]) for item in response.json()["results"]}
    assert listed == {(project.pk, "owner"), (shared.pk, "member")}


def test_creating_a_project_makes_the_caller_its_owner(api, user):
    response = api.post("/api/projects/", {"name": "research"}, format="json")

    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["name"] == "research" and body["owner"] == "alice" and body["role"] == "owner"
    assert Membership.objects.get(project_id=body["id"], user=user).role == "owner"


def test_a_second_project_of_the_same_name_is_a_conflict_naming_the_field(api, project):
    response = api.post("/api/projects/", {"name": project.name}, format="json")

    assert response.status_code == 409
    assert list(response.json()["error"]["fields"]) == ["name"]


def test_a_missing_name_is_400_in_the_one_error_shape(api):
    response = api.post("/api/projects/", {}, format="json")

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert list(error["fields"]) == ["name"]
    assert error["message"].startswith("name:")


def test_an_anonymous_request_is_401_in_the_one_error_shape(client, db):
    response = client.get("/api/projects/")

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "not_authenticated"
    assert response.json()["error"]["fields"] == {}


def test_the_api_root_answers_without_authentication(client, db):
    response = client.get("/api/")

    assert response.status_code == 200
    assert response.json()["runs"] == "/api/runs/"
