"""A telemetry post with one series the platform cannot store keeps the others, and says which it refused."""

from __future__ import annotations

from telemetry.models import MetricPoint

from .builders import step_event

TOO_LONG = "custom/" + "x" * 70  # past MetricPoint.name's 64 characters


def test_a_series_name_too_long_is_refused_alone_with_its_reason_and_counted(trainer_api, running_run):
    """Before, one name past 64 characters refused the whole post (400), and the trainer dropped it."""
    url = f"/api/trainer/runs/{running_run.pk}/telemetry/"
    posted = trainer_api.post(url, {"events": [
        step_event(running_run.pk, 1, rollout_metrics={TOO_LONG: 1.0, "custom/fits": 2.0}),
        step_event(running_run.pk, 2),
    ]}, format="json")

    assert posted.status_code == 202, posted.content
    reply = posted.json()
    assert reply["refused_series"] == [{"step": 1, "name": TOO_LONG,
                                        "reason": "longer than 64 characters"}]
    stored = dict(MetricPoint.objects.filter(run=running_run, step=1).values_list("name", "value"))
    assert stored["custom/fits"] == 2.0 and stored["loss"] == 0.5 and TOO_LONG not in stored
    # Never silently: the run's own series counts what each step lost.
    assert stored["telemetry/series_refused"] == 1.0
    assert MetricPoint.objects.filter(run=running_run, step=2, name="loss").exists()
    assert not MetricPoint.objects.filter(run=running_run, step=2, name="telemetry/series_refused").exists()


def test_a_series_name_with_a_nul_character_is_refused_alone(trainer_api, running_run):
    posted = trainer_api.post(f"/api/trainer/runs/{running_run.pk}/telemetry/", {"events": [
        step_event(running_run.pk, 1, rollout_metrics={"latency\x00": 1.0})]}, format="json")

    assert posted.status_code == 202, posted.content
    assert [(refused["name"], refused["reason"]) for refused in posted.json()["refused_series"]] == [
        ("latency\x00", "holds a NUL character, which PostgreSQL cannot store")]
    stored = dict(MetricPoint.objects.filter(run=running_run, step=1).values_list("name", "value"))
    assert stored["telemetry/series_refused"] == 1.0 and "loss" in stored
