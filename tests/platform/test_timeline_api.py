"""The timeline's data: each step's stages and episodes stored from the trainer's posts, kept for the
newest steps only, and read back in one answer per window (real PostgreSQL)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from tandem.contracts import TrainerStepEvent
from telemetry.models import StepTimelineRecord
from telemetry.selectors import step_timeline_recent
from telemetry.services import metric_events_record, step_timelines_store

from .builders import episode_span, step_event, timeline_event

pytestmark = pytest.mark.django_db

T0 = 1_700_000_000.0


def _post(trainer_api, run, events):
    response = trainer_api.post(
        f"/api/trainer/runs/{run.pk}/telemetry/", {"events": events}, format="json"
    )
    assert response.status_code == 202, response.json()
    return response


def _events(run_id, steps, *, episodes_per_step=4):
    """Steps 1 s apart; each consumed ``episodes_per_step`` episodes that ran during the step before."""
    return [
        timeline_event(run_id, step, started_at=T0 + step, episodes=[
            episode_span(f"g{step}", index, started_at=T0 + step - 0.9 + 0.05 * index, seconds=0.7,
                         status="failed" if index == 3 else "ok")
            for index in range(episodes_per_step)
        ])
        for step in steps
    ]


def test_a_telemetry_post_stores_each_steps_stages_and_every_episode(trainer_api, api, running_run):
    events = _events(running_run.pk, [1, 2, 3])
    events[2]["episodes"].append(episode_span("old", 0, started_at=T0, outcome="dropped_stale"))
    _post(trainer_api, running_run, events)

    body = api.get(f"/api/runs/{running_run.pk}/timeline/").json()

    assert body["run"] == running_run.pk and body["status"] == "running"
    assert body["steps_kept"] == 2000
    assert [step["step"] for step in body["steps"]] == [1, 2, 3]
    first = body["steps"][0]
    assert (first["phase"], first["policy_version"]) == ("rl", 1)
    assert first["started_at"] == T0 + 1 and first["ended_at"] == pytest.approx(T0 + 2)
    assert [stage["name"] for stage in first["stages"]] == [
        "data_wait", "batch", "host_to_device", "compute", "publish", "telemetry"
    ]
    assert first["stages"][0] == {"name": "data_wait", "started_at": T0 + 1, "ended_at": T0 + 1.3}
    assert first["episodes"] == events[0]["episodes"]
    assert [e["outcome"] for e in body["steps"][2]["episodes"]] == [
        "trained", "trained", "trained", "failed", "dropped_stale"
    ]
    assert body["started_at"] == T0 + 1 and body["ended_at"] == pytest.approx(T0 + 4)
    # The metric series are stored as before.
    assert running_run.metric_points.filter(name="stage/data_wait_s").count() == 3


def test_a_step_posted_again_replaces_its_timeline(trainer_api, api, running_run):
    _post(trainer_api, running_run, _events(running_run.pk, [1, 2]))
    # A trainer resumed from a checkpoint trains step 2 again, on other episodes.
    again = timeline_event(running_run.pk, 2, started_at=T0 + 50,
                           episodes=[episode_span("retrained", 0, started_at=T0 + 49)])
    _post(trainer_api, running_run, [again])

    steps = api.get(f"/api/runs/{running_run.pk}/timeline/").json()["steps"]

    assert [step["step"] for step in steps] == [1, 2]
    assert steps[1]["started_at"] == T0 + 50
    assert [e["group_id"] for e in steps[1]["episodes"]] == ["retrained"]


def test_only_the_newest_steps_are_kept(running_run, settings):
    settings.TANDEM_TIMELINE_STEPS_KEPT = 5
    for first in range(1, 13, 3):
        events = [TrainerStepEvent.model_validate(e) for e in _events(running_run.pk, range(first, first + 3))]
        metric_events_record(run=running_run, events=events)

    kept = list(StepTimelineRecord.objects.filter(run=running_run).order_by("step").values_list("step", flat=True))

    assert kept == [8, 9, 10, 11, 12]
    # The series keep every step.
    assert running_run.metric_points.filter(name="loss").count() == 12


def test_retention_is_per_run(make_run, project, environment, settings):
    settings.TANDEM_TIMELINE_STEPS_KEPT = 2
    quiet, busy = make_run(project, environment=environment), make_run(project, environment=environment)
    step_timelines_store(run=quiet, events=[TrainerStepEvent.model_validate(e) for e in _events(quiet.pk, [1, 2])])
    step_timelines_store(run=busy, events=[TrainerStepEvent.model_validate(e) for e in _events(busy.pk, range(1, 9))])

    assert StepTimelineRecord.objects.filter(run=quiet).count() == 2
    assert list(StepTimelineRecord.objects.filter(run=busy).values_list("step", flat=True).order_by("step")) == [7, 8]


def test_events_without_a_timeline_leave_nothing_to_draw(trainer_api, api, running_run):
    _post(trainer_api, running_run, [step_event(running_run.pk, 1)])

    body = api.get(f"/api/runs/{running_run.pk}/timeline/").json()

    assert body["steps"] == [] and body["started_at"] is None and body["ended_at"] is None


def test_sft_steps_have_stages_and_no_episodes(trainer_api, api, running_run):
    _post(trainer_api, running_run, [timeline_event(running_run.pk, 1, started_at=T0, phase="sft")])

    step = api.get(f"/api/runs/{running_run.pk}/timeline/").json()["steps"][0]

    assert step["phase"] == "sft" and step["episodes"] == [] and len(step["stages"]) == 6


def test_last_and_after_step_choose_the_window(trainer_api, api, running_run):
    _post(trainer_api, running_run, _events(running_run.pk, range(1, 11), episodes_per_step=1))

    def steps(query: str) -> list[int]:
        response = api.get(f"/api/runs/{running_run.pk}/timeline/?{query}")
        assert response.status_code == 200, response.json()
        return [step["step"] for step in response.json()["steps"]]

    assert steps("") == list(range(1, 11))
    assert steps("last=3") == [8, 9, 10]
    assert steps("last=3&after_step=8") == [9, 10]
    assert steps("after_step=10") == []
    assert [r.step for r in step_timeline_recent(run=running_run, last=2, after_step=3).steps] == [9, 10]


@pytest.mark.parametrize(
    ("query", "field"),
    [("last=0", "last"), ("last=201", "last"), ("last=many", "last"), ("after_step=x", "after_step")],
)
def test_bad_parameters_are_400_naming_the_field(api, running_run, query, field):
    response = api.get(f"/api/runs/{running_run.pk}/timeline/?{query}")

    assert response.status_code == 400
    assert list(response.json()["error"]["fields"]) == [field]


def test_the_timeline_is_for_the_runs_project_only(client_for, make_user, running_run):
    assert client_for(make_user()).get(f"/api/runs/{running_run.pk}/timeline/").status_code == 404
    assert APIClient().get(f"/api/runs/{running_run.pk}/timeline/").status_code == 401


def test_a_window_takes_a_fixed_number_of_queries(api, running_run, django_assert_num_queries):
    events = [TrainerStepEvent.model_validate(e) for e in _events(running_run.pk, range(1, 31))]
    metric_events_record(run=running_run, events=events)
    api.get("/api/projects/")  # records the token's last use first

    # The token with its user, the run (its project and environment joined), the episode counts, the steps,
    # and the idle summary's three: the newest steps, their wall and wait totals, their idle series.
    with django_assert_num_queries(7):
        response = api.get(f"/api/runs/{running_run.pk}/timeline/?last=30")
    assert sum(len(step["episodes"]) for step in response.json()["steps"]) == 120


def test_an_environments_error_text_holding_nul_is_stored_and_read_back_exactly(trainer_api, api, running_run):
    """An environment's error may hold NUL bytes, which jsonb cannot: the step's telemetry is kept whole."""
    reason = "bad\x00byte \ue000 and a literal \\ue0000"
    event = timeline_event(running_run.pk, 1, started_at=T0, episodes=[
        episode_span("g", 0, started_at=T0 - 1, failure_reason=reason, status="failed")
    ])

    _post(trainer_api, running_run, [event])

    [step] = api.get(f"/api/runs/{running_run.pk}/timeline/").json()["steps"]
    assert step["episodes"][0]["failure_reason"] == reason
    assert "\x00" not in StepTimelineRecord.objects.get().episodes[0]["failure_reason"]


def test_an_episode_id_the_database_cannot_store_is_400_naming_it(trainer_api, running_run):
    bad = timeline_event(running_run.pk, 1, started_at=T0, episodes=[
        episode_span("g\x00", 0, started_at=T0 - 1, status="failed")
    ])

    response = trainer_api.post(
        f"/api/trainer/runs/{running_run.pk}/telemetry/", {"events": [bad]}, format="json"
    )

    assert response.status_code == 400
    # The builder makes the trajectory id from the group's: the first field refused is named.
    assert list(response.json()["error"]["fields"]) == ["events.0.episodes.0.trajectory_id"]
    assert not StepTimelineRecord.objects.exists()


def test_a_non_finite_reward_is_stored_as_null(running_run):
    event = timeline_event(running_run.pk, 1, started_at=T0,
                           episodes=[episode_span("g", 0, started_at=T0 - 1, reward=float("nan"))])

    step_timelines_store(run=running_run, events=[TrainerStepEvent.model_validate(event)])

    assert StepTimelineRecord.objects.get(run=running_run).episodes[0]["reward"] is None


def test_the_timeline_page_is_served_with_its_script(client, user, running_run, make_user):
    client.force_login(user)
    response = client.get(f"/runs/{running_run.pk}/timeline/")
    assert response.status_code == 200
    html = response.content.decode()
    assert f'data-timeline-url="/api/runs/{running_run.pk}/timeline/"' in html
    assert "tandem/run_timeline.js" in html
    client.force_login(make_user())
    assert client.get(f"/runs/{running_run.pk}/timeline/").status_code == 404


def test_a_window_stops_adding_older_steps_past_the_episode_budget(trainer_api, api, running_run):
    _post(trainer_api, running_run, _events(running_run.pk, range(1, 11), episodes_per_step=4))

    window = step_timeline_recent(run=running_run, last=10, max_episodes=10)
    assert [row.step for row in window.steps] == [9, 10] and window.truncated
    # The newest step always comes, even alone over the budget.
    assert [row.step for row in step_timeline_recent(run=running_run, last=10, max_episodes=1).steps] == [10]
    whole = step_timeline_recent(run=running_run, last=10)
    assert len(whole.steps) == 10 and not whole.truncated and whole.newest_step == 10
    body = api.get(f"/api/runs/{running_run.pk}/timeline/?last=5").json()
    assert body["newest_step"] == 10 and body["truncated"] is False


def test_a_resumed_trainer_replaces_the_steps_its_dead_predecessor_trained_past_the_checkpoint(
        trainer_api, api, running_run):
    _post(trainer_api, running_run, _events(running_run.pk, range(1, 9), episodes_per_step=1))
    # Resumed from the checkpoint of step 5, an hour later: step 6 is trained anew.
    later = [timeline_event(running_run.pk, 6, started_at=T0 + 3600)]
    _post(trainer_api, running_run, later)

    body = api.get(f"/api/runs/{running_run.pk}/timeline/?last=3").json()

    assert [step["step"] for step in body["steps"]] == [4, 5, 6]
    assert body["steps"][-1]["started_at"] == T0 + 3600
    assert body["newest_step"] == 6  # below a poller's cursor of 8: it fetches the window anew
