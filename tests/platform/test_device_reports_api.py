"""The newest device report of a run, kept beside its metric points (which cannot hold the kind)."""

import json

from .builders import step_event


def _device(**overrides) -> dict:
    report = {"platform": "gpu", "device_kind": "NVIDIA H100 80GB HBM3", "device_count": 8,
              "local_device_count": 8, "memory_in_use_bytes": 40 * 2**30, "duty_cycle": 0.5, "mfu": 0.31,
              "reported_at": 1_800_000_000.0}
    report.update(overrides)
    return report


def test_the_newest_device_report_is_served_and_its_values_are_charted(api, trainer_api, running_run):
    assert api.get(f"/api/runs/{running_run.pk}/devices/").status_code == 404
    events = [step_event(running_run.pk, 1, device=_device(mfu=0.2, reported_at=1_800_000_000.0)),
              step_event(running_run.pk, 2),
              step_event(running_run.pk, 3, device=_device(mfu=0.4, reported_at=1_800_000_010.0))]

    posted = trainer_api.post(f"/api/trainer/runs/{running_run.pk}/telemetry/", {"events": events},
                              format="json")

    assert posted.status_code == 202, posted.content
    body = api.get(f"/api/runs/{running_run.pk}/devices/").json()
    assert body["step"] == 3
    assert (body["report"]["device_kind"], body["report"]["device_count"], body["report"]["mfu"]) == (
        "NVIDIA H100 80GB HBM3", 8, 0.4)
    points = api.get(f"/api/runs/{running_run.pk}/metrics/", {"names": "device/mfu,device/count"}).json()["points"]
    assert [(p["step"], p["name"], p["value"]) for p in points] == [
        (1, "device/count", 8.0), (1, "device/mfu", 0.2), (3, "device/count", 8.0), (3, "device/mfu", 0.4)]


def test_an_older_report_posted_late_does_not_replace_a_newer_one(api, trainer_api, running_run):
    url = f"/api/trainer/runs/{running_run.pk}/telemetry/"
    newer, older = _device(mfu=0.5, reported_at=1_800_000_100.0), _device(mfu=0.1, reported_at=1_800_000_050.0)
    trainer_api.post(url, {"events": [step_event(running_run.pk, 5, device=newer)]}, format="json")
    trainer_api.post(url, {"events": [step_event(running_run.pk, 4, device=older)]}, format="json")

    assert api.get(f"/api/runs/{running_run.pk}/devices/").json()["report"]["mfu"] == 0.5


def test_a_resumed_trainer_reporting_an_earlier_step_later_is_the_newest(api, trainer_api, running_run):
    url = f"/api/trainer/runs/{running_run.pk}/telemetry/"
    before, after = _device(device_count=8, reported_at=1_800_000_100.0), _device(device_count=4,
                                                                                 reported_at=1_800_000_200.0)
    trainer_api.post(url, {"events": [step_event(running_run.pk, 9, device=before)]}, format="json")
    trainer_api.post(url, {"events": [step_event(running_run.pk, 6, device=after)]}, format="json")

    body = api.get(f"/api/runs/{running_run.pk}/devices/").json()
    assert (body["step"], body["report"]["device_count"]) == (6, 4)


def test_others_may_not_see_a_runs_devices(client_for, make_user, trainer_api, running_run):
    trainer_api.post(f"/api/trainer/runs/{running_run.pk}/telemetry/",
                     {"events": [step_event(running_run.pk, 1, device=_device())]}, format="json")

    assert client_for(make_user()).get(f"/api/runs/{running_run.pk}/devices/").status_code == 404


def test_a_non_finite_figure_in_a_device_report_is_stored_as_null(api, trainer_api, running_run):
    """jsonb holds no NaN: a diverged or unmeasurable figure must not fail the whole telemetry post."""
    body = json.dumps({"events": [step_event(running_run.pk, 1, device=_device(mfu=float("nan")))]})
    assert "NaN" in body

    posted = trainer_api.generic("POST", f"/api/trainer/runs/{running_run.pk}/telemetry/", body,
                                 content_type="application/json")

    assert posted.status_code == 202, posted.content
    report = api.get(f"/api/runs/{running_run.pk}/devices/").json()["report"]
    assert report["mfu"] is None and report["duty_cycle"] == 0.5
