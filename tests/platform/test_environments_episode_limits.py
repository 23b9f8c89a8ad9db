"""max_concurrent_episodes of an environment version: registered, advertised by the server, shown, sent."""

import pytest

from environment_registry.models import EnvironmentVersion
from environment_registry.services import environment_ensure, environment_probe_record
from tandem.contracts import ProbeRequest, probe_request_key

from .conftest import probe_report
from .test_environments_api import _fields, _register
from .test_environments_pages import _form


def _version(response) -> dict:
    return response.json()["versions"][0]


def _report(version, *, advertised, failed_check=None):
    report = probe_report(version.probes.filter(status="pending").get(), failed_check=failed_check)
    return report.model_copy(update={"max_concurrent_episodes": advertised})


def test_a_registered_limit_is_stored_shown_and_sent_to_the_probe(
    api, project, redis_client, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = _register(api, project=project.pk, max_concurrent_episodes=4)

    assert response.status_code == 201, response.json()
    version = _version(response)
    assert (version["max_concurrent_episodes"], version["advertised_max_concurrent_episodes"],
            version["episode_limit"]) == (4, None, 4)
    stored = EnvironmentVersion.objects.get(pk=version["id"])
    assert stored.to_spec().max_concurrent_episodes == 4
    request = ProbeRequest.model_validate_json(redis_client.get(probe_request_key(stored.probes.get().pk)))
    assert request.environment.max_concurrent_episodes == 4


def test_without_a_limit_a_version_has_none(api, project):
    version = _version(_register(api, project=project.pk))
    assert (version["max_concurrent_episodes"], version["episode_limit"]) == (None, None)
    assert EnvironmentVersion.objects.get(pk=version["id"]).to_spec().max_concurrent_episodes is None


@pytest.mark.parametrize("limit", [0, -3, 1.5, "many", True, 10**7])
def test_a_limit_that_is_not_a_positive_integer_is_400_naming_it(api, project, limit):
    response = _register(api, project=project.pk, max_concurrent_episodes=limit)
    assert response.status_code == 400 and _fields(response) == ["max_concurrent_episodes"]


@pytest.mark.parametrize(("registered", "advertised", "limit"), [
    (None, 5, 5), (8, 3, 3), (2, 5, 2), (None, None, None),
])
def test_the_smaller_of_the_registered_and_the_advertised_limit_wins(api, project, registered, advertised,
                                                                     limit):
    version = EnvironmentVersion.objects.get(pk=_version(_register(
        api, project=project.pk, max_concurrent_episodes=registered))["id"])

    environment_probe_record(report=_report(version, advertised=advertised))

    version.refresh_from_db()
    assert version.advertised_max_concurrent_episodes == advertised
    assert version.episode_limit == limit and version.to_spec().max_concurrent_episodes == limit
    body = api.get(f"/api/environments/{version.environment_id}/").json()["versions"][0]
    assert (body["advertised_max_concurrent_episodes"], body["episode_limit"]) == (advertised, limit)


def test_each_passed_probe_reads_the_advertised_capacity_again_and_a_failed_one_keeps_it(
    api, project, make_environment
):
    version = EnvironmentVersion.objects.get(pk=_version(_register(api, project=project.pk))["id"])
    environment_probe_record(report=_report(version, advertised=6))
    api.post(f"/api/environments/{version.environment_id}/versions/1/probe/", format="json")
    environment_probe_record(report=_report(version, advertised=None, failed_check="step"))
    version.refresh_from_db()
    assert version.advertised_max_concurrent_episodes == 6

    api.post(f"/api/environments/{version.environment_id}/versions/1/probe/", format="json")
    environment_probe_record(report=_report(version, advertised=None))
    version.refresh_from_db()
    assert version.advertised_max_concurrent_episodes is None and version.episode_limit is None


def test_a_new_version_has_its_own_limit_and_a_changed_limit_is_a_new_version(api, project):
    environment_id = _register(api, project=project.pk, max_concurrent_episodes=4).json()["id"]
    response = api.post(f"/api/environments/{environment_id}/versions/", {
        "kind": "python", "entrypoint": "tests.workers.maze:MazeEnvironment", "settings": {"size": 5},
        "max_concurrent_episodes": 2,
    }, format="json")
    assert response.status_code == 201, response.json()
    limits = dict(EnvironmentVersion.objects.filter(environment_id=environment_id)
                  .values_list("number", "max_concurrent_episodes"))
    assert limits == {1: 4, 2: 2}

    latest = EnvironmentVersion.objects.get(environment_id=environment_id, number=2)
    spec = latest.to_spec()
    assert environment_ensure(user=project.owner, project=project, spec=spec) == latest
    changed = environment_ensure(user=project.owner, project=project,
                                 spec=spec.model_copy(update={"max_concurrent_episodes": 3}))
    assert (changed.number, changed.max_concurrent_episodes) == (3, 3)


def test_the_environment_page_shows_the_limit_and_where_it_comes_from(user, project, api):
    from django.test import Client

    browser = Client()
    browser.force_login(user)
    response = browser.post("/environments/", _form(project, max_concurrent_episodes="8"))
    assert response.status_code == 302
    version = EnvironmentVersion.objects.get(environment__name="maze")
    assert version.max_concurrent_episodes == 8
    environment_probe_record(report=_report(version, advertised=3))

    page = browser.get(response.url).content.decode()

    assert "Concurrent episodes" in page and "at most 3" in page
    assert "registered: 8; advertised by the server: 3" in page


def test_the_page_says_no_limit_when_there_is_none(user, project):
    from django.test import Client

    browser = Client()
    browser.force_login(user)
    response = browser.post("/environments/", _form(project))
    assert response.status_code == 302
    assert "no limit" in browser.get(response.url).content.decode()


def test_the_latency_chart_has_a_slot_wait_variant_of_the_trainers_metrics():
    import re

    from telemetry.charts import RUN_CHARTS

    chart = next(chart for chart in RUN_CHARTS if chart["id"] == "chart-latency")
    pattern = re.compile(chart["family"]["pattern"].replace("(?<", "(?P<"))
    match = pattern.match("rollout/capped/slot_wait_p90_s")
    assert match and (match["environment"], match["variant"], match["order"]) == ("capped", "slot_wait", "90")
    assert ("slot_wait", "slot wait") in chart["variants"]
