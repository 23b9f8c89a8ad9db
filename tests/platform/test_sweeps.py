"""Sweeps on the platform's side, with real PostgreSQL and real Optuna studies stored in it: trials become
runs up to the concurrency, their metrics reach the study, a pruner cancels a trial that falls behind, the
sweep ends with its best run and the parameters' importances, and a study outlives the process."""

from __future__ import annotations

import pytest
from django.db import transaction

from runs.models import Run
from sweeps import studies
from sweeps.models import Sweep, SweepTrial
from sweeps.selectors import sweep_best, sweep_importances
from sweeps.services import sweep_advance, sweep_cancel, sweep_create, sweeps_advance
from tandem.contracts import RunStatus, TrainerStepEvent
from telemetry.services import metric_events_record

from .builders import step_event

pytestmark = pytest.mark.django_db(transaction=True)

LEARNING_RATE = {"rl_learning_rate": {"type": "float", "low": 1e-5, "high": 1e-3, "log": True}}


def _sweep(project, environment, **overrides) -> Sweep:
    arguments = {"environment": environment.name, "name": "lr", "base_config": {"sft_steps": 0, "rl_steps": 3},
                 "search_space": LEARNING_RATE, "sampler": "random", "metric": "reward_mean", "goal": "maximize",
                 "max_runs": 4, "concurrency": 2} | overrides
    with transaction.atomic():  # its first trials start once it commits, as after a request
        sweep = sweep_create(user=project.owner, project=project, **arguments)
    return Sweep.objects.get(pk=sweep.pk)


def _log(run: Run, values: list[float], *, first_step: int = 1) -> None:
    metric_events_record(run=run, events=[TrainerStepEvent.model_validate(step_event(run.pk, step, reward_mean=value))
                                          for step, value in enumerate(values, start=first_step)])


def _end(run: Run, status: str = RunStatus.FINISHED) -> None:
    Run.objects.filter(pk=run.pk).update(status=status)


def _running(sweep: Sweep) -> list[SweepTrial]:
    return list(sweep.trials.filter(state=SweepTrial.State.RUNNING).select_related("run").order_by("number"))


def test_trials_become_runs_up_to_the_concurrency_and_the_sweep_ends_with_its_best_run(project, environment):
    sweep = _sweep(project, environment)

    first = _running(sweep)
    assert len(first) == 2  # its concurrency
    for trial in first:
        assert trial.run.config["rl_learning_rate"] == trial.params["rl_learning_rate"]
        assert 1e-5 <= trial.params["rl_learning_rate"] <= 1e-3
        assert trial.run.tags == [f"sweep:{sweep.pk}"] and trial.run.name == f"lr #{trial.number}"
    assert sweep_advance(sweep_id=sweep.pk) and len(_running(sweep)) == 2  # nothing ended: none more

    values = iter([0.2, 0.7, 0.5, 0.1])
    while (running := _running(sweep)):
        for trial in running:
            _log(trial.run, [0.0, next(values)])
            _end(trial.run)
        sweep_advance(sweep_id=sweep.pk)

    sweep.refresh_from_db()
    trials = list(sweep.trials.order_by("number"))
    assert [trial.state for trial in trials] == ["complete"] * 4
    assert [trial.value for trial in trials] == [0.2, 0.7, 0.5, 0.1]  # each run's metric at its last step
    assert len({trial.params["rl_learning_rate"] for trial in trials}) == 4  # a random sampler draws anew
    best = sweep_best(sweep=sweep)
    assert best.value == 0.7 and sweep.status == Sweep.Status.FINISHED
    assert f"best: run #{best.run_id}, reward_mean 0.7" in sweep.status_reason
    importances, reason = sweep_importances(sweep=sweep)
    assert importances == {"rl_learning_rate": pytest.approx(1.0)} and reason == ""


def test_a_grid_sweep_tries_each_point_once_and_no_more(project, environment):
    sweep = _sweep(project, environment, sampler="grid", max_runs=50, concurrency=8, search_space={
        "rollout.group_size": {"type": "categorical", "choices": [2, 4]},
        "rl_steps": {"type": "int", "low": 2, "high": 3, "step": 1}})

    assert sweep.max_runs == 4  # the grid's size
    trials = _running(sweep)
    assert sorted((t.params["rollout.group_size"], t.params["rl_steps"]) for t in trials) == [
        (2, 2), (2, 3), (4, 2), (4, 3)]
    assert {(t.run.config["rollout"]["group_size"], t.run.config["rl_steps"]) for t in trials} == {
        (2, 2), (2, 3), (4, 2), (4, 3)}


def test_the_median_pruner_cancels_a_trial_that_falls_behind_with_its_reason(project, environment):
    sweep = _sweep(project, environment, pruner="median", max_runs=3, concurrency=3)
    good, better, poor = _running(sweep)
    _log(good.run, [0.5, 0.6, 0.7])
    _log(better.run, [0.6, 0.7, 0.8])
    _end(good.run)
    _end(better.run)
    sweep_advance(sweep_id=sweep.pk)  # two complete trials: the pruner has something to compare with

    _log(poor.run, [0.0, 0.05])
    sweep_advance(sweep_id=sweep.pk)

    poor.refresh_from_db()
    run = Run.objects.get(pk=poor.run_id)
    assert poor.state == SweepTrial.State.PRUNED and poor.reported_step == 2
    assert run.status == RunStatus.CANCELLED
    assert run.status_reason.startswith("Pruned by sweep 'lr' (median pruner) at step 2: reward_mean 0.05")
    sweep.refresh_from_db()
    assert sweep.status == Sweep.Status.FINISHED


def test_a_failed_run_fails_its_trial_and_a_new_process_finds_the_study_in_the_database(project, environment):
    sweep = _sweep(project, environment, max_runs=2, concurrency=1)
    [trial] = _running(sweep)
    Run.objects.filter(pk=trial.run_id).update(status=RunStatus.FAILED, status_reason="trainer error: OOM")
    studies._storage.cache_clear()  # a restarted platform: no engine, no study in memory

    sweep_advance(sweep_id=sweep.pk)

    trial.refresh_from_db()
    assert trial.state == SweepTrial.State.FAILED and trial.reason == "Its run failed: trainer error: OOM"
    study = studies.sweep_study(sweep)
    assert [(t.number, t.state.name) for t in study.trials] == [(0, "FAIL"), (1, "RUNNING")]


def test_a_cancelled_sweep_cancels_its_running_runs_and_starts_no_more(project, environment):
    sweep = _sweep(project, environment, max_runs=4, concurrency=2)
    runs = [trial.run for trial in _running(sweep)]

    sweep_cancel(user=project.owner, sweep=sweep)
    sweep_advance(sweep_id=sweep.pk)

    sweep.refresh_from_db()
    assert sweep.status == Sweep.Status.CANCELLED and sweep.trials.count() == 2
    assert {Run.objects.get(pk=run.pk).status for run in runs} == {RunStatus.CANCELLED}


def test_the_api_creates_a_sweep_and_names_the_field_of_a_bad_search_space(api, project, environment):
    body = {"project": project.pk, "environment": environment.name, "search_space": LEARNING_RATE,
            "metric": "reward_mean", "max_runs": 2, "concurrency": 1, "base_config": {"sft_steps": 0}}
    created = api.post("/api/sweeps/", body, format="json")
    assert created.status_code == 201, created.json()
    assert created.json()["sampler"] == "tpe" and len(created.json()["trials"]) == 1

    bad = api.post("/api/sweeps/", {**body, "search_space": {"rl_learning_rate": {"type": "float", "low": 1}}},
                   format="json")
    assert bad.status_code == 400 and list(bad.json()["error"]["fields"]) == ["search_space.rl_learning_rate"]
    not_a_setting = api.post("/api/sweeps/", {**body, "search_space": {"rl_learning_ratee": {
        "type": "categorical", "choices": [1]}}}, format="json")
    assert not_a_setting.status_code == 400 and "rl_learning_ratee" in not_a_setting.json()["error"]["message"]
    too_many = api.post("/api/sweeps/", {**body, "concurrency": 1001}, format="json")  # the quota: 1000 in tests
    assert too_many.status_code == 400 and "concurrency" in too_many.json()["error"]["fields"]


@pytest.mark.parametrize("sweeps", [1, 6])
def test_the_sweep_list_takes_a_fixed_number_of_queries(api, project, environment, sweeps,
                                                        django_assert_num_queries):
    for _ in range(sweeps):
        _sweep(project, environment, max_runs=2, concurrency=2)
    api.get("/api/projects/")  # records the token's last use, a write that happens once a minute

    # The token with its user, the page's count and rows, and one prefetch of every trial with its run.
    with django_assert_num_queries(4):
        listed = api.get("/api/sweeps/").json()
    assert len(listed["results"]) == sweeps and all(len(sweep["trials"]) == 2 for sweep in listed["results"])
    assert listed["results"][0]["importances_reason"].startswith("Read the sweep itself")


def test_a_sweep_that_cannot_advance_says_why_and_the_others_go_on(project, environment):
    broken = _sweep(project, environment, max_runs=2, concurrency=1)
    working = _sweep(project, environment, max_runs=2, concurrency=1)
    Sweep.objects.filter(pk=broken.pk).update(search_space={"rl_learning_rate": {"type": "nonsense"}})
    for sweep in (broken, working):  # each ends its first trial, and asks its study for the next
        [trial] = _running(sweep)
        _end(trial.run)

    assert sorted(sweeps_advance()) == sorted([broken.pk, working.pk])

    broken.refresh_from_db()
    assert broken.status == Sweep.Status.RUNNING
    assert broken.status_reason.startswith("Its last advance failed, tried again in a moment: InvalidInput")
    assert len(_running(working)) == 1 and working.trials.count() == 2  # its next trial started
