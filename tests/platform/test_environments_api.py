import pytest

from environment_registry.models import Environment, EnvironmentProbe, EnvironmentVersion
from environment_registry.services import environment_probe_record
from tandem.contracts import PROBE_QUEUE, ProbeRequest, probe_request_key

from .conftest import probe_report

CALC_TOOL = {
    "name": "calc",
    "description": "Evaluates an expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
}


def _register(api, **overrides):
    payload = {
        "name": "maze",
        "kind": "python",
        "entrypoint": "tests.workers.maze:MazeEnvironment",
        "settings": {"size": 5},
        "tools": [CALC_TOOL],
    }
    payload.update(overrides)
    return api.post("/api/environments/", payload, format="json")


def _fields(response) -> list[str]:
    return list(response.json()["error"]["fields"])


def test_registering_creates_version_one_pending_its_probe(api, project):
    response = _register(api, project=project.pk)

    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["project"] == project.pk and body["name"] == "maze"
    [version] = body["versions"]
    assert version["number"] == 1 and version["status"] == "pending"
    assert version["dispatchable"] is False
    assert version["settings"] == {"size": 5} and version["tools"] == [CALC_TOOL]
    assert body["latest_version"]["id"] == version["id"]
    stored = EnvironmentVersion.objects.get(pk=version["id"])
    assert stored.to_spec().settings == {"size": 5}
    assert stored.probes.get().purpose == "registration"


def test_registration_sends_the_probe_request_once_committed(
    api, project, redis_client, django_capture_on_commit_callbacks
):
    redis_client.delete(PROBE_QUEUE)

    with django_capture_on_commit_callbacks(execute=True):
        response = _register(api, project=project.pk)

    probe = EnvironmentProbe.objects.get(version_id=response.json()["versions"][0]["id"])
    request = ProbeRequest.model_validate_json(redis_client.get(probe_request_key(probe.pk)))
    assert request.purpose == "registration"
    assert request.environment.name == "maze" and request.environment.version == 1
    assert request.environment.tools[0].name == "calc"
    assert redis_client.llen(PROBE_QUEUE) == 1
    redis_client.delete(PROBE_QUEUE, probe_request_key(probe.pk))


@pytest.mark.parametrize(
    "entrypoint",
    [
        "environments.maze",
        "workers/maze:Maze",
        "maze:",
        ":Maze",
        "a:b:c",
        "1maze:Maze",
        "maze: Maze",
        "",
    ],
)
def test_a_malformed_entrypoint_is_400_naming_entrypoint(api, project, entrypoint):
    response = _register(api, project=project.pk, entrypoint=entrypoint)

    assert response.status_code == 400
    assert _fields(response) == ["entrypoint"]


def test_an_unknown_kind_is_400_naming_kind(api, project):
    response = _register(api, project=project.pk, kind="docker")

    assert response.status_code == 400
    assert _fields(response) == ["kind"]


def test_settings_must_be_an_object(api, project):
    response = _register(api, project=project.pk, settings=[1, 2])

    assert response.status_code == 400
    assert _fields(response) == ["settings"]


def test_unknown_fields_are_400_naming_them(api, project):
    response = _register(api, project=project.pk, params={"size": 5}, colour="blue")

    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {"colour": ["Unknown field."],
                                                  "params": ["Renamed 'settings'."]}


def test_an_adapter_kind_loads_its_adapter_and_refuses_another_entrypoint(api, project):
    http = _register(api, project=project.pk, kind="http", entrypoint="",
                     settings={"url": "http://127.0.0.1:8765"}, tools=[])
    foreign = _register(api, project=project.pk, name="other", kind="http",
                        settings={"url": "http://127.0.0.1:8765"})

    assert http.status_code == 201, http.json()
    version = http.json()["versions"][0]
    assert version["kind"] == "http"
    assert version["entrypoint"] == "environments.adapters.http:RemoteHTTPEnvironment"
    assert foreign.status_code == 400 and _fields(foreign) == ["entrypoint"]


@pytest.mark.parametrize(
    ("kind", "field"),
    [("http", "settings.url"), ("openenv", "settings.url"), ("gymnasium", "settings.factory"),
     ("reasoning_gym", "settings.dataset")],
)
def test_an_adapter_without_its_required_setting_is_400_naming_it(api, project, kind, field):
    response = _register(api, project=project.pk, kind=kind, entrypoint="", settings={})

    assert response.status_code == 400
    assert _fields(response) == [field]


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://[fe80::1]:8080",
        "http://[::ffff:169.254.169.254]/",
        "http://100.100.100.200/",
        "file:///etc/passwd",
    ],
)
def test_link_local_and_metadata_urls_are_refused_by_default(api, project, url):
    response = _register(api, project=project.pk, kind="http", entrypoint="", settings={"url": url})

    assert response.status_code == 400
    assert _fields(response) == ["settings.url"]


def test_with_an_allow_list_only_listed_hosts_and_networks_register(api, project, settings):
    settings.TANDEM_ENVIRONMENT_URL_ALLOWLIST = ["10.0.0.0/8", "envs.example.com"]

    def register(name, url):
        return _register(api, project=project.pk, name=name, kind="http", entrypoint="",
                         settings={"url": url}, tools=[])

    assert register("listed-network", "http://10.1.2.3:8765").status_code == 201
    assert register("listed-name", "https://envs.example.com").status_code == 201
    refused = register("unlisted", "http://192.168.1.5:8765")
    assert refused.status_code == 400 and _fields(refused) == ["settings.url"]
    assert "allow-list" in refused.json()["error"]["message"]


@pytest.mark.parametrize(
    ("tools", "field"),
    [
        ([{**CALC_TOOL, "parameters": {"type": "string"}}], "tools.0.parameters"),
        ([{**CALC_TOOL, "parameters": {"type": "object", "required": "expression"}}],
         "tools.0.parameters"),
        ([CALC_TOOL, CALC_TOOL], "tools.1.name"),
        ([{**CALC_TOOL, "name": "two words"}], "tools.0.name"),
    ],
)
def test_malformed_tool_schemas_are_400_naming_the_tool(api, project, tools, field):
    response = _register(api, project=project.pk, tools=tools)

    assert response.status_code == 400
    assert _fields(response) == [field]


def test_a_name_taken_in_the_project_is_a_conflict_naming_name(api, project, environment):
    response = _register(api, project=project.pk, name=environment.name)

    assert response.status_code == 409
    assert _fields(response) == ["name"]


def test_the_same_name_is_free_in_another_project(api, project, environment, make_project, user):
    other = make_project(owner=user)

    response = _register(api, project=other.pk, name=environment.name)

    assert response.status_code == 201


def test_a_new_version_leaves_the_earlier_one_as_it_was(api, project):
    first = _register(api, project=project.pk).json()

    second = api.post(f"/api/environments/{first['id']}/versions/",
                      {"entrypoint": "tests.workers.maze:MazeV2", "settings": {"size": 9}},
                      format="json")

    assert second.status_code == 201, second.json()
    assert second.json()["number"] == 2 and second.json()["settings"] == {"size": 9}
    assert second.json()["tools"] == []
    one = api.get(f"/api/environments/{first['id']}/versions/1/").json()
    assert one["settings"] == {"size": 5} and one["tools"] == [CALC_TOOL]
    detail = api.get(f"/api/environments/{first['id']}/").json()
    assert [version["number"] for version in detail["versions"]] == [2, 1]
    assert detail["latest_version"]["number"] == 2


def test_the_version_page_of_the_api_shows_each_check_with_its_latency(api, project):
    body = _register(api, project=project.pk).json()
    version = EnvironmentVersion.objects.get(pk=body["versions"][0]["id"])

    environment_probe_record(report=probe_report(version.probes.get(), failed_check="step"))
    shown = api.get(f"/api/environments/{body['id']}/versions/1/").json()

    assert shown["status"] == "failed"
    assert "step: boom" in shown["status_reason"]
    [probe] = shown["probes"]
    assert probe["status"] == "failed" and probe["purpose"] == "registration"
    assert [(check["name"], check["status"]) for check in probe["checks"]] == [
        ("load", "passed"), ("reset", "passed"), ("step", "failed")
    ]
    assert all(check["latency_s"] == 0.01 for check in probe["checks"])
    assert probe["duration_s"] == pytest.approx(0.05)


def test_probing_again_is_accepted_and_pending(api, project, environment):
    response = api.post(f"/api/environments/{environment.pk}/versions/1/probe/")

    assert response.status_code == 202
    assert response.json()["purpose"] == "manual" and response.json()["status"] == "pending"


def test_a_viewer_may_not_register_environments_or_versions(client_for, make_user, make_project,
                                                             make_environment):
    viewer = make_user()
    project = make_project(viewers=[viewer])
    environment = make_environment(project)
    client = client_for(viewer)

    registered = _register(client, project=project.pk)
    versioned = client.post(f"/api/environments/{environment.pk}/versions/",
                            {"entrypoint": "tests.workers.other:B"}, format="json")
    probed = client.post(f"/api/environments/{environment.pk}/versions/1/probe/")

    assert [registered.status_code, versioned.status_code, probed.status_code] == [403, 403, 403]
    assert registered.json()["error"]["code"] == "permission_denied"


def test_another_users_project_and_environment_are_not_found(api, make_project, make_environment):
    others = make_project()
    environment = make_environment(others)

    assert _register(api, project=others.pk).status_code == 404
    assert api.get(f"/api/environments/{environment.pk}/").status_code == 404
    assert api.get(f"/api/environments/{environment.pk}/versions/1/").status_code == 404
    assert api.post(f"/api/environments/{environment.pk}/versions/1/probe/").status_code == 404


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
    assert only_other[0]["latest_version"]["status"] == "ready"


def test_listing_costs_the_same_queries_for_many_environments(
    api, project, make_environment, django_assert_num_queries
):
    from environment_registry.builtin import CALCULATOR

    for index in range(5):
        make_environment(project, CALCULATOR.model_copy(update={"name": f"calc-{index}"}))

    api.get("/api/projects/")  # records the token's last use, a write that happens once a minute
    # auth token, count, page, versions prefetch
    with django_assert_num_queries(4):
        response = api.get("/api/environments/")

    assert response.json()["count"] == 5


def test_listing_a_project_of_someone_else_is_not_found(api, make_project):
    assert api.get(f"/api/environments/?project={make_project().pk}").status_code == 404
    assert api.get("/api/environments/?project=abc").status_code == 400


def test_environments_are_deleted_with_their_versions(project, environment):
    project.delete()

    assert not Environment.objects.exists() and not EnvironmentVersion.objects.exists()


def test_a_tool_server_must_be_one_the_operator_lists_and_reaches_the_probe(
    api, project, user, settings, redis_client, django_capture_on_commit_callbacks
):
    from django.test import Client

    settings.TANDEM_MCP_SERVERS = {"arithmetic": ("python", "server.py")}
    refused = _register(api, project=project.pk, tool_server={"command": "rm"})
    assert refused.status_code == 400 and _fields(refused) == ["tool_server.command"]
    assert "TANDEM_MCP_SERVERS" in refused.json()["error"]["fields"]["tool_server.command"][0]

    with django_capture_on_commit_callbacks(execute=True):
        registered = _register(api, project=project.pk, tool_server={"command": "arithmetic"})

    assert registered.status_code == 201, registered.json()
    [version] = registered.json()["versions"]
    assert version["tool_server"] == {"command": "arithmetic"}
    probe = EnvironmentProbe.objects.get(version_id=version["id"])
    request = ProbeRequest.model_validate_json(redis_client.get(probe_request_key(probe.pk)))
    assert request.environment.tool_server.command == "arithmetic"
    # Without the server it is another definition: a version of its own.
    again = api.post(f"/api/environments/{registered.json()['id']}/versions/", {
        "kind": "python", "entrypoint": "tests.workers.maze:MazeEnvironment", "settings": {"size": 5},
        "tools": [CALC_TOOL], "tool_server": None}, format="json")
    assert again.status_code == 201 and again.json()["number"] == 2, again.json()
    browser = Client()
    browser.force_login(user)
    page = browser.get(f"/environments/{registered.json()['id']}/").content.decode()
    assert "MCP server <code>arithmetic</code>" in page


@pytest.mark.parametrize(("tool_server", "field", "message"), [
    ({"url": "http://169.254.169.254:80/mcp"}, "tool_server.url", "169.254.169.254"),
    ({"url": "ftp://tools.example.com:21/mcp"}, "tool_server.url", "must start with one of http://, https://"),
    ({"url": "http://tools.example.com:8000/mcp", "command": "arithmetic"}, "tool_server.url", "exactly one"),
    ({}, "tool_server.command", "exactly one"),
])
def test_a_tool_server_url_is_held_to_the_rules_of_environment_urls(api, project, settings, tool_server, field,
                                                                       message):
    settings.TANDEM_MCP_SERVERS = {"arithmetic": ("python", "server.py")}
    refused = _register(api, project=project.pk, tool_server=tool_server)

    assert refused.status_code == 400 and _fields(refused) == [field], refused.json()
    assert message in refused.json()["error"]["fields"][field][0]


def test_a_tool_server_url_is_registered_and_shown(api, project, user, redis_client,
                                                   django_capture_on_commit_callbacks):
    from django.test import Client

    url = "http://tools.example.com:8000/mcp"
    with django_capture_on_commit_callbacks(execute=True):
        registered = _register(api, project=project.pk, tool_server={"url": url})

    assert registered.status_code == 201, registered.json()
    [version] = registered.json()["versions"]
    assert version["tool_server"] == {"url": url}
    probe = EnvironmentProbe.objects.get(version_id=version["id"])
    request = ProbeRequest.model_validate_json(redis_client.get(probe_request_key(probe.pk)))
    assert request.environment.tool_server.url == url and request.environment.tool_server.command is None
    browser = Client()
    browser.force_login(user)
    page = browser.get(f"/environments/{registered.json()['id']}/").content.decode()
    assert f"MCP server at <code>{url}</code>" in page


@pytest.mark.parametrize(("agent_settings", "field"), [
    ({}, "settings.url"),
    ({"url": "http://agents.example:9000", "command": "react"}, "settings.command"),
    ({"command": "rm"}, "settings.command"),
    ({"command": "  "}, "settings.command"),
])
def test_an_agent_needs_exactly_one_of_a_url_and_a_listed_command(api, project, settings, agent_settings, field):
    settings.TANDEM_AGENT_COMMANDS = {"react": ("python", "agent.py")}
    response = _register(api, project=project.pk, kind="agent", entrypoint="", settings=agent_settings, tools=[])

    assert response.status_code == 400, response.json()
    assert _fields(response) == [field]
    if agent_settings == {"command": "rm"}:
        assert "TANDEM_AGENT_COMMANDS" in response.json()["error"]["fields"][field][0]


def test_an_agent_program_registers_and_its_probe_is_requested(
    api, project, settings, redis_client, django_capture_on_commit_callbacks
):
    settings.TANDEM_AGENT_COMMANDS = {"react": ("python", "agent.py")}
    with django_capture_on_commit_callbacks(execute=True):
        registered = _register(api, project=project.pk, kind="agent", entrypoint="",
                               settings={"command": "react", "timeout_s": 60}, tools=[])

    assert registered.status_code == 201, registered.json()
    [version] = registered.json()["versions"]
    assert version["kind"] == "agent" and version["entrypoint"] == "environments.adapters.agent:AgentProgramEnvironment"
    probe = EnvironmentProbe.objects.get(version_id=version["id"])
    request = ProbeRequest.model_validate_json(redis_client.get(probe_request_key(probe.pk)))
    assert request.environment.kind == "agent" and request.environment.settings["command"] == "react"


def test_a_tool_servers_probe_calls_must_name_declared_tools_and_reach_the_probe(
    api, project, settings, redis_client, django_capture_on_commit_callbacks
):
    settings.TANDEM_MCP_SERVERS = {"arithmetic": ("python", "server.py")}
    refused = _register(api, project=project.pk, tool_server={"command": "arithmetic", "probe_calls": [
        {"name": "calc", "arguments": {"expression": "1+1"}}, {"name": "rm", "arguments": {}}]})
    assert refused.status_code == 400 and _fields(refused) == ["tool_server.probe_calls.1.name"]

    with django_capture_on_commit_callbacks(execute=True):
        registered = _register(api, project=project.pk, tool_server={"command": "arithmetic", "probe_calls": [
            {"name": "calc", "arguments": {"expression": "1+1"}}]})
    assert registered.status_code == 201, registered.json()
    [version] = registered.json()["versions"]
    assert version["tool_server"] == {"command": "arithmetic",
                                      "probe_calls": [{"name": "calc", "arguments": {"expression": "1+1"}}]}
    probe = EnvironmentProbe.objects.get(version_id=version["id"])
    request = ProbeRequest.model_validate_json(redis_client.get(probe_request_key(probe.pk)))
    assert [call.name for call in request.environment.tool_server.probe_calls] == ["calc"]
