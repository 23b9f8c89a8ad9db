"""The registry's dashboard pages: list, registration form, versions with probe reports."""

import re

import pytest
from django.test import Client

from environment_registry.models import EnvironmentVersion
from environment_registry.services import environment_probe_record

from .conftest import probe_report


@pytest.fixture
def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _form(project, **overrides):
    data = {
        "project": project.pk,
        "name": "maze",
        "kind": "python",
        "entrypoint": "tests.workers.maze:MazeEnvironment",
        "settings": '{"size": 5}',
        "tools": "",
    }
    data.update(overrides)
    return data


def test_pages_need_a_login(client, environment):
    for path in ("/environments/", f"/environments/{environment.pk}/"):
        response = client.get(path)
        assert response.status_code == 302 and response.url.startswith("/login/?next=")


def test_the_list_shows_each_environment_with_its_latest_status(browser, environment, make_project,
                                                                make_environment):
    make_environment(make_project())  # someone else's

    page = browser.get("/environments/").content.decode()

    assert re.findall(r'href="/environments/(\d+)/"', page) == [str(environment.pk)]
    assert 'badge badge-ready">Ready' in page
    assert 'id="register-environment-form"' in page


def test_registering_through_the_form_creates_a_pending_version(browser, project):
    response = browser.post("/environments/", _form(project))

    version = EnvironmentVersion.objects.get(environment__name="maze")
    assert response.status_code == 302
    assert response.url == f"/environments/{version.environment_id}/"
    assert version.settings == {"size": 5} and version.status == "pending"
    page = browser.get(response.url).content.decode()
    assert "Registered maze@1; its probe is running." in page
    assert "Waiting for a worker" in page


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"settings": "{not json"}, "Not JSON"),
        ({"settings": "[1]"}, "Must be an object."),
        ({"kind": "http", "entrypoint": "", "settings": "{}"}, "settings.url: Kind &#x27;http&#x27; needs"),
        ({"kind": "http", "entrypoint": "", "settings": '{"url": "http://169.254.169.254/"}'},
         "link-local or cloud-metadata"),
        ({"tools": '[{"name": "calc", "parameters": {"type": "string"}}]'},
         "tools.0.parameters: Must be a JSON schema of type"),
    ],
)
def test_a_bad_registration_shows_the_error_on_the_form(browser, project, overrides, message):
    response = browser.post("/environments/", _form(project, **overrides))

    assert response.status_code == 200
    assert message in response.content.decode()
    assert not EnvironmentVersion.objects.exists()


def test_the_detail_page_shows_each_check_with_its_latency_and_the_reason(browser, project,
                                                                          make_environment):
    environment = make_environment(project, probed=False)
    version = environment.versions.get()
    environment_probe_record(report=probe_report(version.probes.get(), failed_check="step"))

    page = browser.get(f"/environments/{environment.pk}/").content.decode()

    assert "Version 1" in page and 'badge badge-failed">Probe failed' in page
    assert "Registration probe" in page and "step: boom" in page
    assert page.count("10.0 ms") == 3  # every check's latency
    assert "5 s" in page  # its timeout
    assert "&quot;name&quot;: &quot;calc&quot;" in page  # the declared tool schemas


def test_probe_again_requests_a_manual_probe(browser, environment):
    response = browser.post(f"/environments/{environment.pk}/versions/1/probe/")

    assert response.status_code == 302
    assert environment.versions.get().probes.filter(purpose="manual", status="pending").count() == 1


def test_someone_elses_environment_is_404(browser, make_project, make_environment):
    environment = make_environment(make_project())

    assert browser.get(f"/environments/{environment.pk}/").status_code == 404
    assert browser.post(f"/environments/{environment.pk}/versions/1/probe/").status_code == 404


def test_a_run_page_says_why_the_run_waits_for_its_environment(browser, project, make_environment,
                                                             make_run):
    environment = make_environment(project, probed=False)
    run = make_run(project, environment=environment)

    page = browser.get(f"/runs/{run.pk}/").content.decode()

    assert "calculator@1" in page
    assert "Waiting for environment calculator@1 (probe pending)" in page
