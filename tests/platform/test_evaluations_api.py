"""Held-out evaluations: the trainer's reports, their metric series, the run's list and the run page's table."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from rest_framework.test import APIClient

from evaluations.models import Evaluation
from runs.services import run_claim_next
from tandem.contracts import (
    EVALUATION_STATUSES,
    TRAINER_HEADER,
    EvaluationProgress,
    EvaluationReport,
    TrainerConflictCode,
    evaluation_progress_key,
)
from telemetry.models import MetricBucket, MetricPoint


def _trainer_evaluations(run_id: int) -> str:
    return f"/api/trainer/runs/{run_id}/evaluations/"


def _evaluations(run_id: int) -> str:
    return f"/api/runs/{run_id}/evaluations/"


def evaluation_report(index: int = 0, *, step: int = 20, **overrides) -> dict:
    """An EvaluationReport as the trainer posts it: 8 tasks of 4 samples, pass@1 and pass@4."""
    report = {
        "evaluation": index,
        "step": step,
        "policy_version": step // 2,
        "environment": "calculator@1",
        "status": "complete",
        "tasks": 8,
        "samples_per_task": 4,
        "temperature": 0.7,
        "episodes": 32,
        "metrics": {"success_rate": 0.625, "mean_reward": 0.5, "pass@1": 0.625, "pass@4": 0.875,
                    "avg@4": 0.625, "mean_turns": 2.0},
        "intervals": {"success_rate": [0.45, 0.77], "pass@4": [0.53, 0.98]},
        "trajectory_ids": [f"eval-{index}-{episode}" for episode in range(32)],
    }
    report.update(overrides)
    return EvaluationReport.model_validate(report).model_dump(mode="json")


def _eval_points(run) -> list[tuple[str, int, float]]:
    return sorted(MetricPoint.objects.filter(run=run, name__startswith="eval/")
                  .values_list("name", "step", "value"))


def test_an_evaluations_statuses_are_the_contracts():
    assert [value for value, _ in Evaluation._meta.get_field("status").choices] == list(EVALUATION_STATUSES)


def test_a_report_is_stored_and_its_retry_updates_the_same_evaluation_without_new_points(trainer_api, running_run):
    first = trainer_api.post(_trainer_evaluations(running_run.pk), evaluation_report(), format="json")

    assert first.status_code == 201, first.content
    stored = first.json()
    assert (stored["run"], stored["index"], stored["step"], stored["policy_version"]) == (running_run.pk, 0, 20, 10)
    assert stored["metrics"]["pass@4"] == 0.875 and stored["intervals"]["pass@4"] == [0.53, 0.98]
    assert stored["trajectory_ids"][:2] == ["eval-0-0", "eval-0-1"]
    points = _eval_points(running_run)
    assert ("eval/success_rate", 20, 0.625) in points and ("eval/pass@1", 20, 0.625) in points
    assert len(points) == 6

    retried = trainer_api.post(_trainer_evaluations(running_run.pk), evaluation_report(
        status="incomplete", reason="the run ended with 30 of 32 episodes in", episodes=30,
        metrics={**evaluation_report()["metrics"], "success_rate": 0.6}), format="json")

    assert retried.status_code == 200, retried.content
    assert retried.json()["status"] == "incomplete" and retried.json()["episodes"] == 30
    evaluation = Evaluation.objects.get(run=running_run)
    assert (evaluation.index, evaluation.status, evaluation.metrics["success_rate"]) == (0, "incomplete", 0.6)
    assert evaluation.updated_at > evaluation.created_at
    points = _eval_points(running_run)
    assert len(points) == 6  # replaced, not added
    assert ("eval/success_rate", 20, 0.6) in points and ("eval/success_rate", 20, 0.625) not in points


def test_the_metrics_read_back_through_the_runs_metrics_and_chart_apis(api, trainer_api, running_run):
    for index, (step, success_rate) in enumerate([(10, 0.25), (20, 0.5)]):
        body = evaluation_report(index, step=step, metrics={"success_rate": success_rate, "pass@1": success_rate})
        assert trainer_api.post(_trainer_evaluations(running_run.pk), body, format="json").status_code == 201

    response = api.get(f"/api/runs/{running_run.pk}/metrics/?names=eval/success_rate")

    assert response.status_code == 200, response.content
    assert response.json()["points"] == [
        {"step": 10, "name": "eval/success_rate", "value": 0.25},
        {"step": 20, "name": "eval/success_rate", "value": 0.5},
    ]
    # Charts of long runs read the buckets, which the same post keeps up to date: one point asked
    # is one bucket of both evaluations.
    assert MetricBucket.objects.filter(run=running_run, name="eval/pass@1").exists()
    chart = api.get(f"/api/runs/{running_run.pk}/metrics/series/?names=eval/pass@1&points=1").json()
    assert chart["series"]["eval/pass@1"] == {
        "first_step": [10], "last_step": [20], "count": [2], "min": [0.25], "max": [0.5], "mean": [0.375],
    }


@pytest.mark.parametrize(("change", "field"), [
    ({"status": "done"}, "status"),
    ({"metrics": None}, "metrics"),
    ({"metrics": {"success_rate": "most"}}, "metrics.success_rate"),
    ({"samples_per_task": 0}, "samples_per_task"),
    ({"step": 2**31}, "step"),
    ({"environment": "calc\x00ulator@1"}, "environment"),
    ({"metrics": {"x" * 60: 0.5}}, f"metrics.{'x' * 60}"),  # eval/ and it are longer than a series name
    ({"intervals": {"pass@1": [0.1]}}, "intervals.pass@1.1"),  # its missing upper bound
    ({"shoe_size": 42}, "shoe_size"),
])
def test_a_bad_report_is_400_naming_the_field_and_stores_nothing(trainer_api, running_run, change, field):
    body = {**evaluation_report(), **change}
    if body["metrics"] is None:
        del body["metrics"]

    response = trainer_api.post(_trainer_evaluations(running_run.pk), json.dumps(body),
                                content_type="application/json")

    assert response.status_code == 400, response.content
    fields = response.json()["error"]["fields"]
    assert field in fields, fields
    assert not Evaluation.objects.filter(run=running_run).exists()
    assert _eval_points(running_run) == []


def test_a_metric_too_large_for_a_double_is_400_naming_it(trainer_api, running_run):
    """1e400 is valid JSON and reads as infinity, which neither jsonb nor a JSON answer can hold."""
    body = json.dumps({**evaluation_report(), "metrics": {"pass@1": 123.25}}).replace("123.25", "1e400")

    response = trainer_api.post(_trainer_evaluations(running_run.pk), body, content_type="application/json")

    assert response.status_code == 400, response.content
    assert list(response.json()["error"]["fields"]) == ["metrics.pass@1"]
    assert not Evaluation.objects.filter(run=running_run).exists()


def test_a_trainer_that_does_not_hold_the_run_is_409_and_stores_nothing(trainer, running_run):
    stale = APIClient()
    stale.credentials(HTTP_AUTHORIZATION=f"Token {trainer.raw_token}", HTTP_X_TANDEM_TRAINER="dead-host:9")

    response = stale.post(_trainer_evaluations(running_run.pk), evaluation_report(), format="json")

    assert response.status_code == 409, response.content
    assert response.json()["error"]["code"] == TrainerConflictCode.RUN_HELD_BY_ANOTHER_TRAINER
    assert not Evaluation.objects.filter(run=running_run).exists()


def test_a_run_no_trainer_holds_is_409_run_not_claimed(trainer_api, make_run):
    queued = make_run()

    response = trainer_api.post(_trainer_evaluations(queued.pk), evaluation_report(), format="json")

    assert response.status_code == 409, response.content
    assert response.json()["error"]["code"] == TrainerConflictCode.RUN_NOT_CLAIMED


def test_a_report_that_does_not_name_its_trainer_is_400_naming_the_header(client_for, trainer, running_run):
    response = client_for(trainer).post(_trainer_evaluations(running_run.pk), evaluation_report(), format="json")

    assert response.status_code == 400, response.content
    assert list(response.json()["error"]["fields"]) == [TRAINER_HEADER]
    assert not Evaluation.objects.filter(run=running_run).exists()


def test_a_user_who_is_not_a_trainer_may_not_report(api, running_run):
    response = api.post(_trainer_evaluations(running_run.pk), evaluation_report(), format="json",
                        HTTP_X_TANDEM_TRAINER="trainer-host:1")

    assert response.status_code == 403, response.content
    assert not Evaluation.objects.filter(run=running_run).exists()


def test_the_list_holds_the_runs_evaluations_by_index(api, trainer_api, running_run):
    for index in (1, 0):
        body = evaluation_report(index, step=10 * (index + 1))
        assert trainer_api.post(_trainer_evaluations(running_run.pk), body, format="json").status_code == 201

    response = api.get(_evaluations(running_run.pk))

    assert response.status_code == 200, response.content
    listed = response.json()
    assert listed["count"] == 2
    assert [(item["index"], item["step"]) for item in listed["results"]] == [(0, 10), (1, 20)]
    assert listed["results"][0]["environment"] == "calculator@1"
    assert listed["results"][0]["intervals"]["success_rate"] == [0.45, 0.77]


def test_another_projects_user_gets_404_from_the_list(client_for, make_user, trainer_api, running_run):
    assert trainer_api.post(_trainer_evaluations(running_run.pk), evaluation_report(), format="json").status_code == 201
    outsider = client_for(make_user("outsider"))

    response = outsider.get(_evaluations(running_run.pk))

    assert response.status_code == 404, response.content
    assert "calculator@1" not in response.content.decode()
    assert outsider.get(_evaluations(10**9)).status_code == 404


@pytest.mark.parametrize("count", [1, 12])
def test_the_list_takes_a_fixed_number_of_queries(api, trainer_api, running_run, count, django_assert_num_queries):
    for index in range(count):
        assert trainer_api.post(_trainer_evaluations(running_run.pk), evaluation_report(index),
                                format="json").status_code == 201
    api.get("/api/projects/")  # records the token's last use, a write that happens once a minute
    # Authentication, the run with its project check, then the page's count and rows.
    with django_assert_num_queries(4):
        response = api.get(_evaluations(running_run.pk))
    assert len(response.json()["results"]) == count


@pytest.fixture
def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_run_page_shows_the_evaluations_table_with_intervals(browser, trainer_api, running_run):
    reports = [
        evaluation_report(0, step=10, environment="<script>alert(1)</script>@1"),
        evaluation_report(1, step=20, status="incomplete", reason="run ended", episodes=30,
                          metrics={"success_rate": 0.5, "mean_reward": 0.25, "pass@1": 0.5, "pass@16": 0.75},
                          intervals={}),
    ]
    for report in reports:
        assert trainer_api.post(_trainer_evaluations(running_run.pk), report, format="json").status_code == 201

    html = browser.get(f"/runs/{running_run.pk}/").content.decode()

    assert 'id="evaluations-table"' in html
    table = html[html.index('id="evaluations-table"'):html.index("</table>", html.index('id="evaluations-table"'))]
    # One column per pass@k any evaluation has, smallest k first.
    assert table.index("<th>pass@1</th>") < table.index("<th>pass@4</th>") < table.index("<th>pass@16</th>")
    assert "<th>Success rate</th>" in table and "<th>Mean reward</th>" in table
    first = table[table.index('data-evaluation="0"'):table.index('data-evaluation="1"')]
    assert "0.625 <span" in first and "[0.450, 0.770]" in first  # success rate with its interval
    assert "[0.530, 0.980]" in first  # pass@4's
    assert "&lt;script&gt;alert(1)&lt;/script&gt;@1" in first and "<script>alert" not in html
    second = table[table.index('data-evaluation="1"'):]
    assert "badge-evaluation-incomplete" in second and "run ended" in second
    assert "<td>30</td>" in second and "<td>0.750</td>" in second and "<td>—</td>" in second  # no pass@4


def test_a_run_without_evaluations_has_no_table(browser, running_run):
    html = browser.get(f"/runs/{running_run.pk}/").content.decode()

    assert 'id="run-status"' in html  # the page itself rendered
    assert 'id="evaluations-table"' not in html


def _keep_checkpoints(run, *steps, deleted=()):
    from checkpoints.models import Checkpoint

    for step in (*steps, *deleted):
        Checkpoint.objects.create(run=run, step=step, policy_version=step, path=f"/ckpt/run-{run.pk}/{step}",
                                  size_bytes=1, status="deleted" if step in deleted else "available")


def test_an_evaluation_only_run_clones_the_run_from_its_newest_kept_checkpoint(api, running_run):
    refused = api.post(f"/api/runs/{running_run.pk}/evaluate/", {}, format="json")
    assert refused.status_code == 400 and "step" in refused.json()["error"]["fields"], refused.content

    _keep_checkpoints(running_run, 20, 30, deleted=(10,))
    created = api.post(f"/api/runs/{running_run.pk}/evaluate/", {"name": "replay"}, format="json")
    assert created.status_code == 201, created.content
    config = created.json()["config"]
    assert config["start_from"] == {"run": running_run.pk, "step": 30}
    assert (config["sft_steps"], config["rl_steps"]) == (0, 0)
    assert config["evaluation"]["tasks"] == 32  # the run has no evaluation section: the defaults
    assert config["model"] == running_run.config["model"] and created.json()["name"] == "replay"

    pinned = api.post(f"/api/runs/{running_run.pk}/evaluate/", {"step": 20, "evaluation": {"tasks": 4}},
                      format="json")
    assert pinned.status_code == 201, pinned.content
    assert pinned.json()["config"]["start_from"]["step"] == 20 and pinned.json()["config"]["evaluation"]["tasks"] == 4


@pytest.mark.parametrize(("body", "field"), [
    ({"step": 10}, "step"),  # deleted by retention
    ({"step": 11}, "step"),
    ({"evaluation": {"tasks": 0}}, "evaluation.tasks"),
    ({"evaluation": {"samples_per_task": 2, "pass_k": [4]}}, "evaluation"),
])
def test_an_evaluation_only_run_of_no_kept_checkpoint_or_a_bad_section_is_refused_naming_the_field(
        api, running_run, body, field):
    _keep_checkpoints(running_run, 20, deleted=(10,))
    refused = api.post(f"/api/runs/{running_run.pk}/evaluate/", body, format="json")
    assert refused.status_code == 400, refused.content
    assert field in refused.json()["error"]["fields"], refused.json()
    if field == "step":
        assert "kept steps are 20" in refused.json()["error"]["message"]


def test_another_projects_user_cannot_evaluate_a_runs_checkpoint(client_for, make_user, running_run):
    _keep_checkpoints(running_run, 20)
    outsider = client_for(make_user("mallory"))
    assert outsider.post(f"/api/runs/{running_run.pk}/evaluate/", {}, format="json").status_code == 404


def test_a_config_cannot_start_from_a_checkpoint_it_names_itself(api, running_run, project, environment):
    _keep_checkpoints(running_run, 20)
    direct = api.post("/api/runs/", {"project": project.pk, "environment": environment.name,
                                     "config": {"start_from": {"run": running_run.pk, "step": 20}}}, format="json")
    assert direct.status_code == 400 and "config.start_from" in direct.json()["error"]["fields"], direct.content
    cloned = api.post(f"/api/runs/{running_run.pk}/clone/",
                      {"config": {"start_from": {"run": running_run.pk, "step": 20}}}, format="json")
    assert cloned.status_code == 400 and "config.start_from" in cloned.json()["error"]["fields"], cloned.content
    # A clone of an evaluation-only run keeps the checkpoint that was checked for it.
    replay = api.post(f"/api/runs/{running_run.pk}/evaluate/", {}, format="json").json()
    again = api.post(f"/api/runs/{replay['id']}/clone/", {"config": {"evaluation": {"tasks": 8}}}, format="json")
    assert again.status_code == 201 and again.json()["config"]["start_from"] == replay["config"]["start_from"]


# --- progress: what the trainer keeps in Redis while an evaluation's episodes come back --------------

def _progress(run_id: int) -> str:
    return f"/api/runs/{run_id}/evaluations/progress/"


@pytest.fixture
def progress_hash(redis_client):
    """``write(run, progress...)`` sets the trainer's progress hash of ``run`` in the platform's Redis."""
    written = []

    def write(run, *progress: EvaluationProgress, raw: dict[str, str] | None = None) -> None:
        key = evaluation_progress_key(run.pk)
        written.append(key)
        redis_client.delete(key)  # the same run id in an earlier test database
        fields = {str(item.evaluation): item.model_dump_json() for item in progress} | (raw or {})
        if fields:
            redis_client.hset(key, mapping=fields)

    yield write
    if written:
        redis_client.delete(*written)


def _evaluation_progress(index: int, *, received: int, status: str = "running") -> EvaluationProgress:
    return EvaluationProgress(evaluation=index, policy_version=10 * index, episodes_expected=32,
                              episodes_received=received, status=status)


def test_the_progress_of_each_evaluation_is_read_from_its_trainers_hash_first_one_first(
        api, running_run, progress_hash):
    progress_hash(running_run, _evaluation_progress(1, received=12), _evaluation_progress(0, received=32,
                                                                                          status="complete"),
                  raw={"2": '{"schema_version": 99}'})  # a newer trainer's shape: left out

    response = api.get(_progress(running_run.pk))

    assert response.status_code == 200, response.content
    assert response.json() == {"run": running_run.pk, "evaluations": [
        {"evaluation": 0, "policy_version": 0, "episodes_expected": 32, "episodes_received": 32,
         "status": "complete"},
        {"evaluation": 1, "policy_version": 10, "episodes_expected": 32, "episodes_received": 12,
         "status": "running"},
    ]}


def test_a_run_whose_trainer_asked_for_no_evaluation_yet_has_no_progress(api, running_run, progress_hash):
    progress_hash(running_run)

    assert api.get(_progress(running_run.pk)).json() == {"run": running_run.pk, "evaluations": []}


def test_the_progress_says_when_redis_cannot_be_read(api, running_run, settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"

    response = api.get(_progress(running_run.pk))

    assert response.status_code == 200 and response.json() == {"run": running_run.pk, "evaluations": None}


def test_another_projects_user_gets_404_from_the_progress(client_for, make_user, running_run, progress_hash):
    progress_hash(running_run, _evaluation_progress(0, received=5))
    outsider = client_for(make_user("outsider"))

    response = outsider.get(_progress(running_run.pk))

    assert response.status_code == 404, response.content
    assert "episodes_received" not in response.content.decode()
    assert outsider.get(_progress(10**9)).status_code == 404


@pytest.mark.parametrize("count", [1, 12])
def test_the_progress_takes_a_fixed_number_of_queries(api, running_run, progress_hash, count,
                                                      django_assert_num_queries):
    progress_hash(running_run, *(_evaluation_progress(index, received=index) for index in range(count)))
    api.get("/api/projects/")  # records the token's last use, a write that happens once a minute
    # Authentication, then the run with its project check; the progress itself is in Redis.
    with django_assert_num_queries(2):
        response = api.get(_progress(running_run.pk))
    assert len(response.json()["evaluations"]) == count


def test_an_evaluation_of_an_environment_of_the_longest_name_keeps_every_metric_in_a_series_that_fits(
        trainer_api, running_run):
    """Before, ``eval/<name@version>/`` of a 100-character name left no room: the whole report was refused."""
    label = "support-" + "x" * 92 + "@1"  # the registry's longest name (Environment.name)
    posted = trainer_api.post(_trainer_evaluations(running_run.pk), evaluation_report(environment=label),
                              format="json")

    assert posted.status_code == 201, posted.content
    names = [name for name, _, _ in _eval_points(running_run)]
    assert len(names) == 6 and all(len(name) <= 64 and name.startswith("eval/support-xxx") for name in names)
    assert all(name.startswith(f"eval/{posted.json()['series_label']}/") for name in names)
    assert {name.rsplit("/", 1)[1] for name in names} == set(evaluation_report()["metrics"])
    assert len({name.rsplit("/", 1)[0] for name in names}) == 1  # one label, one cut, one hash


def _claimed(make_run, project, environment, config):
    run = make_run(project, environment=environment, config=config)
    claimed = run_claim_next(worker="trainer-host:1")
    assert claimed is not None and claimed.pk == run.pk
    return run


def _finish(trainer_api, run) -> dict:
    trainer_api.post(f"/api/trainer/runs/{run.pk}/heartbeat/", {"worker": "trainer-host:1"}, format="json")
    response = trainer_api.post(f"/api/trainer/runs/{run.pk}/heartbeat/",
                                {"status": "finished", "worker": "trainer-host:1", "message": "done"}, format="json")
    assert response.status_code == 200, response.content
    return response.json()


INCOMPLETE = {"status": "incomplete", "episodes": 0, "trajectory_ids": [],
              "reason": "0 of 32 episodes came back within evaluation.timeout_s (600s) of the run's end"}


def test_an_evaluation_only_run_whose_evaluation_is_incomplete_fails_with_its_reason(
        trainer_api, api, make_run, project, environment):
    run = _claimed(make_run, project, environment, {"sft_steps": 0, "rl_steps": 0, "evaluation": {"tasks": 8}})
    assert trainer_api.post(_trainer_evaluations(run.pk), evaluation_report(0, step=0, **INCOMPLETE),
                            format="json").status_code == 201

    assert _finish(trainer_api, run)["status"] == "failed"
    shown = api.get(f"/api/runs/{run.pk}/").json()
    assert shown["status"] == "failed"
    assert shown["status_reason"].startswith("Its evaluation is incomplete: evaluation 0 of calculator@1 at step 0: "
                                             "0 of 32 episodes (0 of 32 episodes came back within")


def test_a_training_run_with_an_incomplete_evaluation_finishes_saying_so(
        trainer_api, api, make_run, project, environment):
    run = _claimed(make_run, project, environment, {"sft_steps": 0, "rl_steps": 2, "evaluation": {"tasks": 8}})
    for report in (evaluation_report(0, step=0), evaluation_report(1, step=2, **INCOMPLETE)):
        assert trainer_api.post(_trainer_evaluations(run.pk), report, format="json").status_code == 201

    assert _finish(trainer_api, run)["status"] == "finished"
    reason = api.get(f"/api/runs/{run.pk}/").json()["status_reason"]
    assert reason.startswith("Finished with 1 incomplete evaluation: evaluation 1 of calculator@1 at step 2: "
                             "0 of 32 episodes")
    assert "evaluation 0" not in reason


def test_a_run_whose_evaluations_all_came_back_finishes_with_the_trainers_message(
        trainer_api, api, make_run, project, environment):
    run = _claimed(make_run, project, environment, {"sft_steps": 0, "rl_steps": 0, "evaluation": {"tasks": 8}})
    assert trainer_api.post(_trainer_evaluations(run.pk), evaluation_report(0, step=0),
                            format="json").status_code == 201

    assert _finish(trainer_api, run)["status"] == "finished"
    assert api.get(f"/api/runs/{run.pk}/").json()["status_reason"] == "done"
