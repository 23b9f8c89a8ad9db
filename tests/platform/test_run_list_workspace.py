"""The run list as a workspace: summary columns, tags and notes, and what the page costs."""

from __future__ import annotations

import datetime

import pytest
from django.test import Client
from django.utils import timezone

from runs.models import Run
from runs.services import run_annotate
from runs.summaries import run_list_summarised, run_summary
from telemetry.models import MetricPoint, StepTimelineRecord

pytestmark = pytest.mark.django_db


def _record_steps(run: Run, rewards: dict[int, float], *, seconds_per_step: float = 2.0, phase: str = "rl") -> None:
    """Hand-built telemetry: reward_mean at each step, and a timeline row per step ``seconds_per_step`` long."""
    MetricPoint.objects.bulk_create(
        MetricPoint(run=run, step=step, name="reward_mean", value=reward) for step, reward in rewards.items()
    )
    StepTimelineRecord.objects.bulk_create(
        StepTimelineRecord(run=run, step=step, phase=phase, policy_version=step, started_at=1000.0 + step * seconds_per_step,
                           ended_at=1000.0 + (step + 1) * seconds_per_step, stages={})
        for step in rewards
    )


def _summarised(run: Run) -> Run:
    return run_list_summarised(Run.objects.filter(pk=run.pk)).get()


def test_the_summary_reports_progress_reward_duration_and_eta_from_the_runs_telemetry(make_run, project, environment):
    run = make_run(project, environment=environment, config={"sft_steps": 10, "rl_steps": 20})
    _record_steps(run, {11: 0.2, 12: 0.9, 13: 0.5, 14: 0.4})
    started = timezone.now() - datetime.timedelta(minutes=5)
    Run.objects.filter(pk=run.pk).update(status="running", trainer_step=14, started_at=started)

    summary = run_summary(_summarised(run), now=started + datetime.timedelta(minutes=5, seconds=3))

    assert summary.progress_label == "SFT 10/10 · RL 4/20"
    assert summary.latest_reward == 0.4  # the newest step's, not the newest row's
    assert summary.best_reward == 0.9
    assert summary.duration_label == "5m 03s"
    # Four steps of 2 s each over the newest steps; 16 RL steps left.
    assert summary.seconds_per_step == 2.0
    assert summary.eta_label == "32s"


def test_the_eta_times_each_phase_at_its_own_rate_and_says_at_least_before_an_rl_step_is_timed(
    make_run, project, environment
):
    run = make_run(project, environment=environment, config={"sft_steps": 10, "rl_steps": 20})
    _record_steps(run, {1: 0.0, 2: 0.0, 3: 0.0, 4: 0.0}, seconds_per_step=1.0, phase="sft")
    Run.objects.filter(pk=run.pk).update(status="running", trainer_step=4, started_at=timezone.now())

    during_sft = run_summary(_summarised(run))

    # 6 SFT steps left at 1 s; the 20 RL steps are not timed yet, so the ETA is a lower bound.
    assert (during_sft.seconds_per_step, during_sft.eta_at_least, during_sft.eta_label) == (1.0, True, "≥ 6s")
    assert "no RL step is timed yet" in during_sft.eta_title

    StepTimelineRecord.objects.filter(run=run).delete()
    _record_steps(run, {8: 0.0, 9: 0.0, 10: 0.0}, seconds_per_step=1.0, phase="sft")
    _record_steps(run, {11: 0.2, 12: 0.4}, seconds_per_step=3.0)
    Run.objects.filter(pk=run.pk).update(trainer_step=12)

    during_rl = run_summary(_summarised(run))

    # The SFT steps in the window do not dilute the RL rate: 18 RL steps left at 3 s each.
    assert (during_rl.seconds_per_step, during_rl.eta_at_least, during_rl.eta_label) == (3.0, False, "54s")


def test_a_finished_run_has_a_fixed_duration_and_no_eta(make_run, project, environment):
    run = make_run(project, environment=environment, config={"sft_steps": 0, "rl_steps": 3})
    _record_steps(run, {1: 0.1, 2: 0.3, 3: 0.2})
    started = timezone.now() - datetime.timedelta(hours=3)
    Run.objects.filter(pk=run.pk).update(status="finished", trainer_step=3, started_at=started,
                                         finished_at=started + datetime.timedelta(hours=2, minutes=7))

    summary = run_summary(_summarised(run))

    assert summary.progress_label == "RL 3/3"
    assert summary.duration_label == "2h 07m"
    assert summary.eta is None


def test_a_run_without_telemetry_has_no_reward_duration_or_eta(make_run, project, environment):
    summary = run_summary(_summarised(make_run(project, environment=environment)))

    assert summary.progress_label == "SFT 0/2 · RL 0/2"
    assert (summary.latest_reward, summary.best_reward, summary.duration, summary.eta) == (None, None, None, None)


def test_the_list_page_shows_the_summary_and_the_failure_reason_on_hover(make_run, project, environment, user):
    run = make_run(project, environment=environment, config={"sft_steps": 0, "rl_steps": 5}, name="broken")
    _record_steps(run, {1: 0.25})
    Run.objects.filter(pk=run.pk).update(status="failed", trainer_step=1, status_reason="CheckpointError: disk full")
    run_annotate(user=user, run=run, tags=["baseline"], notes="lr too high")
    browser = Client()
    browser.force_login(user)

    html = browser.get("/runs/").content.decode()

    assert 'title="CheckpointError: disk full"' in html
    assert "RL 1/5" in html and "0.250" in html
    assert '<span class="tag">baseline</span>' in html and "lr too high" in html


@pytest.mark.parametrize("count", [1, 6])
def test_the_list_page_costs_the_same_queries_for_any_number_of_runs(
    make_run, project, environment, user, count, django_assert_num_queries,
):
    for index in range(count):
        run = make_run(project, environment=environment, name=f"run-{index}")
        _record_steps(run, {1: 0.1, 2: 0.2})
    browser = Client()
    browser.force_login(user)
    browser.get("/runs/")  # the session's first read is not the page's

    # Session, user, the quick-start form's projects and environments (4), the user's roles, the runs with their
    # summaries (one query), the environment filter's names (2), the notifications badge.
    with django_assert_num_queries(10):
        assert browser.get("/runs/").status_code == 200


def test_a_writer_edits_tags_and_notes_through_the_api(api, make_run, project, environment):
    run = make_run(project, environment=environment)

    response = api.patch(f"/api/runs/{run.pk}/", {"tags": [" baseline ", "lr-sweep", "Baseline", ""],
                                                  "notes": "first try"}, format="json")

    assert response.status_code == 200, response.content
    assert response.json()["tags"] == ["baseline", "lr-sweep"]
    assert response.json()["notes"] == "first try"
    # Notes alone leave the tags as they are.
    assert api.patch(f"/api/runs/{run.pk}/", {"notes": ""}, format="json").json()["tags"] == ["baseline", "lr-sweep"]
    run.refresh_from_db()
    assert (run.tags, run.notes) == (["baseline", "lr-sweep"], "")


def test_a_viewer_cannot_edit_tags_and_another_projects_user_gets_404(
    client_for, make_user, make_project, make_run, environment, project, user,
):
    viewer = make_user()
    project_with_viewer = make_project(owner=user, viewers=[viewer])
    run = make_run(project_with_viewer)
    stranger = make_user()

    refused = client_for(viewer).patch(f"/api/runs/{run.pk}/", {"tags": ["mine"]}, format="json")
    missing = client_for(stranger).patch(f"/api/runs/{run.pk}/", {"tags": ["mine"]}, format="json")

    assert refused.status_code == 403, refused.content
    assert missing.status_code == 404, missing.content
    run.refresh_from_db()
    assert run.tags == []


def test_too_many_or_too_long_tags_are_refused_naming_the_field(api, make_run, project, environment):
    run = make_run(project, environment=environment)

    too_many = api.patch(f"/api/runs/{run.pk}/", {"tags": [f"t{index}" for index in range(21)]}, format="json")
    too_long = api.patch(f"/api/runs/{run.pk}/", {"tags": ["x" * 41]}, format="json")

    assert too_many.status_code == 400 and "tags" in too_many.json()["error"]["fields"]
    assert too_long.status_code == 400 and "tags" in too_long.json()["error"]["fields"]


def test_the_lists_search_finds_a_run_by_a_tag_as_by_its_name(make_run, project, environment, user):
    tagged = make_run(project, environment=environment, name="first try")
    run_annotate(user=user, run=tagged, tags=["lr-sweep", "baseline"])
    named = make_run(project, environment=environment, name="baseline again")
    make_run(project, environment=environment, name="unrelated")
    client = Client()
    client.force_login(user)

    html = client.get("/runs/", {"q": "BASELINE"}).content.decode()
    assert f'data-run-id="{tagged.pk}"' in html and f'data-run-id="{named.pk}"' in html
    assert html.count('class="run-select"') == 2
    assert client.get("/runs/", {"q": "lr-sw"}).content.decode().count('class="run-select"') == 1


def test_the_list_sorts_by_the_newest_reward_and_by_duration(make_run, project, environment, user):
    low, high, none = (make_run(project, environment=environment, name=name) for name in ("low", "high", "none"))
    _record_steps(low, {1: 0.9, 2: 0.1})
    _record_steps(high, {1: 0.2, 2: 0.8})
    now = timezone.now()
    Run.objects.filter(pk=low.pk).update(started_at=now - datetime.timedelta(hours=2))
    Run.objects.filter(pk=high.pk).update(started_at=now - datetime.timedelta(minutes=5))
    client = Client()
    client.force_login(user)

    def order(sort: str) -> list[int]:
        html = client.get("/runs/", {"sort": sort}).content.decode()
        return [run.pk for run in sorted((low, high, none), key=lambda run: html.index(f'data-run-id="{run.pk}"'))]

    # By the newest step's reward, not the best; a run without an RL step last either way.
    assert order("-reward") == [high.pk, low.pk, none.pk]
    assert order("reward") == [low.pk, high.pk, none.pk]
    assert order("-duration") == [low.pk, high.pk, none.pk]
    assert 'data-sort="reward" href="?sort=reward"' in client.get("/runs/", {"sort": "-reward"}).content.decode()
