"""Alert rules fire once per episode of their condition, from the services that write what they watch
(real PostgreSQL; every hook evaluates once its write commits)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from accounts.services import membership_add
from alerts.models import AlertFiring, AlertRule, Notification
from alerts.services import alert_rule_create
from common.domain_errors import InvalidInput
from environment_registry.services import environment_probe_record, environment_probe_request
from runs.models import Run
from runs.services import run_heartbeat, run_transition, runs_flag_stalled
from tandem.contracts import RunStatus, TrainerHeartbeat, TrainerStepEvent
from telemetry.services import metric_events_record

from .builders import step_event
from .conftest import TRAINER_NAME, probe_report


@pytest.fixture
def on_commit(django_capture_on_commit_callbacks):
    """Runs the callbacks the block registers once it ends, as a commit would (nested ones too)."""
    return lambda: django_capture_on_commit_callbacks(execute=True)


def _rule(project, kind, **settings) -> AlertRule:
    return alert_rule_create(user=project.owner, project=project, name=f"{kind} rule", kind=kind, **settings)


def _fired(rule) -> list[AlertFiring]:
    return list(AlertFiring.objects.filter(rule=rule).order_by("fired_at", "id"))


def _post_steps(run, on_commit, *steps: dict) -> None:
    events = [TrainerStepEvent.model_validate(step) for step in steps]
    with on_commit():
        metric_events_record(run=run, events=events)


def test_a_failed_run_fires_once_and_again_only_after_a_resume(running_run, project, make_user, on_commit):
    member = make_user()
    membership_add(project=project, user=member, role="viewer")
    rule = _rule(project, AlertRule.Kind.RUN_FAILED)
    with on_commit():
        run_transition(run=running_run, to_status=RunStatus.FAILED, reason="CheckpointError: disk full")

    [firing] = _fired(rule)
    assert firing.run_id == running_run.pk and "CheckpointError: disk full" in firing.text
    # Every member of the project is told, viewers too.
    assert set(Notification.objects.filter(firing=firing).values_list("user_id", flat=True)) == {
        project.owner_id, member.pk}

    with on_commit():  # resumed: the condition clears
        run_transition(run=running_run, to_status=RunStatus.QUEUED, reason="Resumed by alice.")
    assert len(_fired(rule)) == 1
    with on_commit():
        run_transition(run=running_run, to_status=RunStatus.FAILED, reason="again")
    assert len(_fired(rule)) == 2


def test_a_finished_run_fires_its_rule_and_a_failed_rule_stays_quiet(running_run, project, on_commit):
    finished, failed = _rule(project, AlertRule.Kind.RUN_FINISHED), _rule(project, AlertRule.Kind.RUN_FAILED)
    with on_commit():
        run_transition(run=running_run, to_status=RunStatus.FINISHED)

    assert len(_fired(finished)) == 1 and _fired(failed) == []
    assert "finished" in _fired(finished)[0].text


def test_a_rolled_back_transition_fires_nothing(running_run, project, on_commit):
    rule = _rule(project, AlertRule.Kind.RUN_FAILED)
    with on_commit(), pytest.raises(RuntimeError), transaction.atomic():
        run_transition(run=running_run, to_status=RunStatus.FAILED, reason="boom")
        raise RuntimeError("the caller's write failed after the transition")

    assert _fired(rule) == []
    assert Run.objects.get(pk=running_run.pk).status == RunStatus.RUNNING


def test_a_disabled_rule_and_another_projects_rule_do_not_fire(running_run, project, make_project, on_commit):
    disabled = _rule(project, AlertRule.Kind.RUN_FAILED, enabled=False)
    elsewhere = _rule(make_project(), AlertRule.Kind.RUN_FAILED)
    with on_commit():
        run_transition(run=running_run, to_status=RunStatus.FAILED, reason="boom")

    assert _fired(disabled) == [] and _fired(elsewhere) == []


def test_a_reward_below_its_threshold_for_n_steps_fires_once_per_collapse(running_run, project, on_commit):
    rule = _rule(project, AlertRule.Kind.METRIC_THRESHOLD, metric="reward_mean", comparison="below",
                 threshold=0.1, steps=3)
    run_id = running_run.pk
    rewards = {1: 0.5, 2: 0.05, 3: 0.02}
    _post_steps(running_run, on_commit, *(step_event(run_id, step, reward_mean=value)
                                           for step, value in rewards.items()))
    assert _fired(rule) == []  # two steps below, not three
    # A retried post of the same steps counts them once.
    _post_steps(running_run, on_commit, step_event(run_id, 3, reward_mean=0.02))
    assert _fired(rule) == []

    _post_steps(running_run, on_commit, step_event(run_id, 4, reward_mean=0.01))
    [firing] = _fired(rule)
    assert firing.details["step"] == 4 and firing.details["steps"] == 3
    assert "reward_mean below 0.1 for 3 steps" in firing.text

    _post_steps(running_run, on_commit, step_event(run_id, 5, reward_mean=0.0),  # still below: no second firing
                step_event(run_id, 6, reward_mean=0.4))  # recovered: re-armed
    assert len(_fired(rule)) == 1
    _post_steps(running_run, on_commit, *(step_event(run_id, step, reward_mean=0.03) for step in (7, 8, 9)))
    assert [firing.details["step"] for firing in _fired(rule)] == [4, 9]


def test_a_metric_above_its_threshold_fires(running_run, project, on_commit):
    rule = _rule(project, AlertRule.Kind.METRIC_THRESHOLD, metric="loss", comparison="above",
                 threshold=2.0, steps=1)
    _post_steps(running_run, on_commit, step_event(running_run.pk, 1, loss=1.0), step_event(running_run.pk, 2, loss=3.0))

    [firing] = _fired(rule)
    assert firing.details == {**firing.details, "metric": "loss", "value": 3.0, "step": 2}


def test_every_project_starts_with_a_tools_unused_rule_that_fires_when_an_environments_tools_go_unused(
        running_run, project, on_commit):
    [rule] = AlertRule.objects.filter(project=project, kind=AlertRule.Kind.TOOLS_UNUSED)
    assert rule.enabled and rule.steps == 10
    AlertRule.objects.filter(pk=rule.pk).update(steps=3)
    run_id = running_run.pk

    def rates(step, calc, search=None):
        metrics = {"rollout/calc/tool_call_rate": calc, "rollout/calc/latency_p50_s": 1.0}
        if search is not None:
            metrics["rollout/search/tool_call_rate"] = search
        return step_event(run_id, step, rollout_metrics=metrics)

    # An SFT step and a step without tools neither extend nor break the streak.
    _post_steps(running_run, on_commit, rates(1, 0.0), step_event(run_id, 2, phase="sft"), rates(3, 0.0, 0.5))
    assert _fired(rule) == []
    _post_steps(running_run, on_commit, rates(4, 0.25), rates(5, 0.0), rates(6, 0.0))  # used at step 4: re-armed
    assert _fired(rule) == []
    _post_steps(running_run, on_commit, rates(7, 0.0, 0.75))
    [firing] = _fired(rule)
    assert firing.details == {**firing.details, "metric": "rollout/calc/tool_call_rate", "value": 0.0,
                              "step": 7, "steps": 3}
    assert "called none of environment calc's tools for 3 steps" in firing.text
    assert Notification.objects.filter(firing=firing).count() == 1


def test_a_trainer_idle_past_its_share_for_y_minutes_fires_once_and_rearms(running_run, project, on_commit):
    rule = _rule(project, AlertRule.Kind.TRAINER_IDLE, threshold=0.5, minutes=2)
    start = 1_700_000_000.0

    def minute_step(step: int, *, wait_s: float) -> dict:
        # A minute-long step, ending a minute after the one before it (the trainer's clock).
        return step_event(running_run.pk, step, wall_s=60.0, wait_s=wait_s, compute_s=60.0 - wait_s,
                          publish_s=0.0, other_s=0.0, emitted_at=start + 60 * step)

    _post_steps(running_run, on_commit, minute_step(1, wait_s=45))
    assert _fired(rule) == []  # idle 75%, for one minute of the two
    _post_steps(running_run, on_commit, minute_step(2, wait_s=45), minute_step(3, wait_s=50))
    [firing] = _fired(rule)
    assert firing.details["step"] == 2 and firing.details["seconds"] == 120.0
    assert "trainer idle above 50% for 2 min" in firing.text

    _post_steps(running_run, on_commit, minute_step(4, wait_s=6))  # busy again: re-armed
    _post_steps(running_run, on_commit, minute_step(5, wait_s=40), minute_step(6, wait_s=40))
    assert [firing.details["step"] for firing in _fired(rule)] == [2, 6]


def _no_progress_for(run, minutes: float) -> None:
    Run.objects.filter(pk=run.pk).update(progress_at=timezone.now() - timedelta(minutes=minutes))


def test_no_progress_for_z_minutes_fires_from_the_watchdog_and_rearms_once_the_step_moves(
    running_run, project, on_commit
):
    rule = _rule(project, AlertRule.Kind.NO_PROGRESS, minutes=10)

    def watchdog_beat() -> None:
        with on_commit():
            runs_flag_stalled()

    _no_progress_for(running_run, 5)
    watchdog_beat()
    assert _fired(rule) == []

    _no_progress_for(running_run, 15)
    watchdog_beat()
    watchdog_beat()  # the next beat: still the same episode
    [firing] = _fired(rule)
    assert firing.run_id == running_run.pk and "no progress for 15 min" in firing.text

    run_heartbeat(run=running_run, heartbeat=TrainerHeartbeat(worker=TRAINER_NAME, trainer_step=1))
    watchdog_beat()  # the step moved: re-armed
    _no_progress_for(running_run, 20)
    watchdog_beat()
    assert len(_fired(rule)) == 2


def test_a_failed_probe_and_an_unhealthy_version_fire_once_each_until_a_probe_passes(
    environment, project, on_commit
):
    probe_failed = _rule(project, AlertRule.Kind.PROBE_FAILED)
    unhealthy = _rule(project, AlertRule.Kind.ENVIRONMENT_UNHEALTHY)
    version = environment.versions.get()

    def health_check(*, failed_check: str | None) -> None:
        with on_commit():
            probe = environment_probe_request(version=version, purpose="health")
            environment_probe_record(report=probe_report(probe, failed_check=failed_check))

    health_check(failed_check="step")
    health_check(failed_check="reset")  # still failing: the same episode
    assert len(_fired(probe_failed)) == 1 and len(_fired(unhealthy)) == 1
    version.refresh_from_db()
    assert version.status == "unhealthy"
    assert _fired(unhealthy)[0].environment_version_id == version.pk
    assert "boom" in _fired(probe_failed)[0].text

    health_check(failed_check=None)  # healthy again: both re-armed
    health_check(failed_check="step")
    assert len(_fired(probe_failed)) == 2 and len(_fired(unhealthy)) == 2


def test_a_rule_scoped_to_a_run_judges_that_run_only(running_run, make_run, project, environment, on_commit):
    other = make_run(project, environment=environment)
    scoped = _rule(project, AlertRule.Kind.METRIC_THRESHOLD, metric="loss", comparison="above", threshold=2.0,
                   steps=1, run=other.pk)
    everywhere = alert_rule_create(user=project.owner, project=project, name="any run", kind="metric_threshold",
                                   metric="loss", comparison="above", threshold=2.0, steps=1)

    _post_steps(running_run, on_commit, step_event(running_run.pk, 1, loss=3.0))

    assert _fired(scoped) == []
    assert [firing.run_id for firing in _fired(everywhere)] == [running_run.pk]


def test_a_rule_is_scoped_only_to_a_run_of_its_project_and_of_a_run_kind(project, make_project, make_run):
    strangers = make_run(make_project())
    with pytest.raises(InvalidInput) as refused:
        _rule(project, AlertRule.Kind.RUN_FAILED, run=strangers.pk)
    assert list(refused.value.fields) == ["run"] and "has no run" in refused.value.message
    mine = make_run(project)
    with pytest.raises(InvalidInput) as refused:
        _rule(project, AlertRule.Kind.PROBE_FAILED, run=mine.pk)
    assert list(refused.value.fields) == ["run"]
    with pytest.raises(InvalidInput) as refused:
        _rule(project, AlertRule.Kind.RUN_FAILED, cooldown_minutes=0)
    assert list(refused.value.fields) == ["cooldown_minutes"]


def test_a_firing_within_the_rules_cooldown_is_recorded_held_back_and_notifies_no_one(
    running_run, project, on_commit, api
):
    rule = _rule(project, AlertRule.Kind.METRIC_THRESHOLD, metric="loss", comparison="above", threshold=2.0,
                 steps=1, cooldown_minutes=30)
    run_id = running_run.pk
    # Above, cleared, above again: two episodes of the condition within 30 minutes.
    _post_steps(running_run, on_commit, step_event(run_id, 1, loss=3.0), step_event(run_id, 2, loss=1.0),
                step_event(run_id, 3, loss=3.0))

    sent, held = _fired(rule)
    assert sent.held_back_reason == "" and Notification.objects.filter(firing=sent).count() == 1
    assert "within the rule's cooldown of 30 min" in held.held_back_reason
    assert Notification.objects.filter(firing=held).count() == 0
    listed = api.get(f"/api/alert-rules/{rule.pk}/").json()
    assert listed["firings_held_back"] == 1 and listed["cooldown_minutes"] == 30
    assert listed["last_fired_at"] == sent.fired_at.isoformat().replace("+00:00", "Z")

    # Past the cooldown, it notifies again.
    AlertFiring.objects.filter(pk=sent.pk).update(fired_at=timezone.now() - timedelta(minutes=31))
    _post_steps(running_run, on_commit, step_event(run_id, 4, loss=1.0), step_event(run_id, 5, loss=3.0))
    assert [firing.held_back_reason == "" for firing in _fired(rule)] == [True, False, True]
