"""How a version's probe and health decide what runs may do: pin, wait, refuse, pause."""

from datetime import timedelta

import pytest

from environment_registry.builtin import CALCULATOR
from environment_registry.models import EnvironmentProbe, EnvironmentVersion
from environment_registry.services import (
    environment_ensure,
    environment_health_sweep,
    environment_probe_record,
    environment_probe_request,
    environment_version_register,
)
from runs.services import run_claim_next
from tandem.contracts import PROBE_QUEUE, environment_paused_key

from .conftest import probe_report

CLAIM = "/api/trainer/claim/"


def _version(environment, number=1) -> EnvironmentVersion:
    return environment.versions.get(number=number)


def _health_check(version, *, failed_check=None, capture=None):
    probe = environment_probe_request(version=version, purpose="health")
    if capture is None:
        return environment_probe_record(report=probe_report(probe, failed_check=failed_check))
    with capture(execute=True):
        return environment_probe_record(report=probe_report(probe, failed_check=failed_check))


def test_a_run_pins_the_latest_version_and_keeps_it(api, project, environment, make_run):
    first = make_run(project, environment=environment)
    environment_version_register(user=project.owner, environment=environment,
                                 spec=CALCULATOR.model_copy(update={"settings": {"max_operand": 9}}))

    second = api.post("/api/runs/", {"environment": "calculator"}, format="json").json()
    pinned = api.post("/api/runs/", {"environment": "calculator@1"}, format="json").json()

    assert first.environment_version.number == 1
    assert second["environment_version"]["number"] == 2
    assert pinned["environment_version"]["number"] == 1
    first.refresh_from_db()
    assert first.environment_version.number == 1


def test_an_unknown_version_is_400_naming_environment(api, project, environment):
    for reference in ("calculator@7", "calculator@x", "nope"):
        response = api.post("/api/runs/", {"environment": reference}, format="json")
        assert response.status_code == 400
        assert list(response.json()["error"]["fields"]) == ["environment"]


def test_a_run_on_a_pending_version_waits_in_the_queue_until_the_probe_passes(
    api, trainer_api, project, make_environment
):
    environment = make_environment(project, probed=False)

    response = api.post("/api/runs/", {"environment": "calculator"}, format="json")

    assert response.status_code == 201
    assert response.json()["environment_version"]["status"] == "pending"
    assert trainer_api.post(CLAIM, {"worker": "t:1"}, format="json").status_code == 204
    environment_probe_record(report=probe_report(_version(environment).probes.get()))
    claimed = trainer_api.post(CLAIM, {"worker": "t:1"}, format="json")
    assert claimed.status_code == 200 and claimed.json()["run"]["id"] == response.json()["id"]


def test_a_failed_probe_refuses_new_runs_and_fails_the_queued_ones(
    api, project, make_environment, make_run
):
    environment = make_environment(project, probed=False)
    queued = make_run(project, environment=environment)

    environment_probe_record(report=probe_report(_version(environment).probes.get(),
                                                 failed_check="reset"))
    response = api.post("/api/runs/", {"environment": "calculator"}, format="json")

    assert response.status_code == 409
    assert list(response.json()["error"]["fields"]) == ["environment"]
    assert "failed its probe" in response.json()["error"]["message"]
    queued.refresh_from_db()
    assert queued.status == "failed" and "reset: boom" in queued.status_reason


def test_a_passing_probe_again_makes_a_failed_version_usable(api, project, make_environment):
    environment = make_environment(project, probed=False)
    version = _version(environment)
    environment_probe_record(report=probe_report(version.probes.get(), failed_check="load"))

    again = environment_probe_request(version=version, purpose="manual")
    environment_probe_record(report=probe_report(again))

    assert api.post("/api/runs/", {"environment": "calculator"}, format="json").status_code == 201


def test_a_second_report_of_the_same_probe_changes_nothing(project, make_environment):
    environment = make_environment(project, probed=False)
    probe = _version(environment).probes.get()

    environment_probe_record(report=probe_report(probe))
    environment_probe_record(report=probe_report(probe, failed_check="step"))

    probe.refresh_from_db()
    assert probe.status == "passed" and _version(environment).status == "ready"


def test_a_failed_health_check_pauses_dispatch_with_its_reason_and_a_pass_resumes_it(
    api, trainer_api, project, environment, make_run, redis_client,
    django_capture_on_commit_callbacks,
):
    version = _version(environment)
    running = make_run(project, environment=environment)
    assert run_claim_next(worker="t:1").pk == running.pk
    queued = make_run(project, environment=environment)

    _health_check(version, failed_check="step", capture=django_capture_on_commit_callbacks)

    version.refresh_from_db()
    assert version.status == "unhealthy" and "Health check probe" in version.status_reason
    paused = redis_client.get(environment_paused_key(version.pk)).decode()
    assert "step: boom" in paused
    shown = api.get(f"/api/runs/{running.pk}/").json()["environment_version"]
    assert shown["status"] == "unhealthy" and shown["dispatchable"] is False
    assert "step: boom" in shown["status_reason"]
    assert trainer_api.post(CLAIM, {"worker": "t:2"}, format="json").status_code == 204

    _health_check(version, capture=django_capture_on_commit_callbacks)

    version.refresh_from_db()
    assert version.status == "ready" and version.status_reason == ""
    assert redis_client.get(environment_paused_key(version.pk)) is None
    claimed = trainer_api.post(CLAIM, {"worker": "t:2"}, format="json")
    assert claimed.json()["run"]["id"] == queued.pk
    redis_client.delete(PROBE_QUEUE)  # the two health probes sent; no worker here runs them


def test_a_health_check_never_overrules_a_pending_or_failed_probe(project, make_environment):
    environment = make_environment(project, probed=False)
    version = _version(environment)

    _health_check(version)

    version.refresh_from_db()
    assert version.status == "pending"


def test_the_sweep_probes_latest_and_in_use_versions_once_and_skips_the_rest(
    project, environment, make_run, make_environment
):
    pinned_old = make_run(project, environment=environment)
    environment_version_register(user=project.owner, environment=environment,
                                 spec=CALCULATOR.model_copy(update={"settings": {"max_operand": 9}}))
    environment_probe_record(report=probe_report(_version(environment, 2).probes.get()))
    environment_version_register(user=project.owner, environment=environment,
                                 spec=CALCULATOR.model_copy(update={"settings": {"max_operand": 7}}))
    pending = make_environment(project, CALCULATOR.model_copy(update={"name": "p"}), probed=False)

    first = environment_health_sweep()
    second = environment_health_sweep()

    health = EnvironmentProbe.objects.filter(purpose="health")
    # v1: pinned by a queued run; v2 ready but neither latest nor pinned; v3 pending.
    assert first == {"expired": 0, "health_probes": 1}
    assert [probe.version.number for probe in health] == [1]
    assert health.get().version.environment == environment != pending
    assert second == {"expired": 0, "health_probes": 0}  # its probe is still in flight
    assert pinned_old.environment_version.number == 1


def test_the_sweep_fails_probes_no_worker_answered(project, make_environment, settings, make_run):
    settings.TANDEM_PROBE_EXPIRY_S = 60
    environment = make_environment(project, probed=False)
    queued = make_run(project, environment=environment)
    EnvironmentProbe.objects.update(requested_at=queued.created_at - timedelta(seconds=61))

    result = environment_health_sweep()

    version = _version(environment)
    assert result["expired"] == 1
    assert version.status == "failed" and "no worker reported within 60s" in version.status_reason
    queued.refresh_from_db()
    assert queued.status == "failed"


def test_ensure_keeps_an_identical_latest_version_and_versions_a_changed_one(project):
    first = environment_ensure(user=project.owner, project=project, spec=CALCULATOR)
    same = environment_ensure(user=project.owner, project=project, spec=CALCULATOR)
    changed = environment_ensure(user=project.owner, project=project,
                                 spec=CALCULATOR.model_copy(update={"tools": ()}))

    assert same.pk == first.pk
    assert changed.number == 2 and changed.tools == []


@pytest.mark.parametrize("status", ["pending", "unhealthy"])
def test_new_runs_may_pin_a_version_that_is_not_ready_yet(api, project, environment, status):
    EnvironmentVersion.objects.filter(environment=environment).update(status=status)

    response = api.post("/api/runs/", {"environment": "calculator"}, format="json")

    assert response.status_code == 201
    assert response.json()["environment_version"]["dispatchable"] is False


def test_the_health_history_keeps_the_newest_checks(project, environment, settings):
    settings.TANDEM_HEALTH_PROBES_KEPT = 2
    version = _version(environment)

    checks = [_health_check(version, failed_check="step" if index == 2 else None)
              for index in range(4)]

    kept = version.probes.filter(purpose="health").order_by("id")
    assert [probe.pk for probe in kept] == [checks[2].pk, checks[3].pk]
    assert version.probes.filter(purpose="registration").count() == 1
