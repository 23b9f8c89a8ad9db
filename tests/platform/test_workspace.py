"""The project workspace's reads and saved views, through the API against a real PostgreSQL: the runs a view
selects with config and metric columns, sorted and filtered; their series on one step grid, with min–max
per bucket; views saved by name, canonical, with their errors naming the key; and nothing of another
project reachable."""

from __future__ import annotations

import pytest
from django.utils import timezone

from runs.models import Run
from tandem.contracts import TrainerStepEvent
from telemetry.models import MetricPoint
from telemetry.services import metric_buckets_rebuild, metric_events_record
from workspaces.services import saved_view_save
from workspaces.view_state import WorkspaceView

from .builders import step_event

pytestmark = pytest.mark.django_db


def _log(run: Run, values: list[float]) -> None:
    metric_events_record(run=run, events=[TrainerStepEvent.model_validate(step_event(run.pk, step, reward_mean=value))
                                          for step, value in enumerate(values, start=1)])


def _runs(make_run, project, environment, rates: list[float], tags: list[list[str]]) -> list[Run]:
    runs = []
    for rate, run_tags in zip(rates, tags, strict=True):
        run = make_run(project, environment=environment, name=f"lr {rate}",
                       config={"sft_steps": 0, "rl_steps": 4, "rl_learning_rate": rate})
        Run.objects.filter(pk=run.pk).update(tags=run_tags)
        runs.append(Run.objects.get(pk=run.pk))
    return runs


def test_the_runs_of_a_view_carry_config_and_metric_columns_sorted_filtered_and_grouped(
        api, make_run, project, environment):
    runs = _runs(make_run, project, environment, [1e-4, 3e-4, 1e-3], [["baseline"], ["sweep"], ["sweep"]])
    for run, final in zip(runs, [0.2, 0.9, 0.5], strict=True):
        _log(run, [0.1, final])

    answer = api.get(f"/api/projects/{project.pk}/workspace/runs/",
                     {"c": "config.rl_learning_rate,metric.reward_mean", "o": "-metric.reward_mean", "g": "tag"})
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert [row["id"] for row in body["runs"]] == [runs[1].pk, runs[2].pk, runs[0].pk]
    assert [row["values"]["metric.reward_mean"] for row in body["runs"]] == [0.9, 0.5, 0.2]
    assert [row["values"]["config.rl_learning_rate"] for row in body["runs"]] == [3e-4, 1e-3, 1e-4]
    assert [row["group"] for row in body["runs"]] == ["sweep", "sweep", "baseline"]
    assert "config.rl_learning_rate" in body["config_keys"] and "reward_mean" in body["metric_names"]
    assert body["matched"] == body["read"] == 3 and body["filtered_out"] == 0

    # A column filter is applied by the platform, and counted; a tag is found by the search.
    filtered = api.get(f"/api/projects/{project.pk}/workspace/runs/",
                       {"c": "metric.reward_mean", "f.metric.reward_mean": ">=0.5", "q": "sweep"}).json()
    assert sorted(row["id"] for row in filtered["runs"]) == sorted([runs[1].pk, runs[2].pk])
    assert filtered["matched"] == 2 and filtered["filtered_out"] == 0
    by_rate = api.get(f"/api/projects/{project.pk}/workspace/runs/",
                      {"f.config.rl_learning_rate": "<0.0005", "g": "config.rl_learning_rate"}).json()
    assert sorted(row["group"] for row in by_rate["runs"]) == ["0.0001", "0.0003"]
    assert by_rate["filtered_out"] == 1


def test_a_bad_view_key_is_refused_naming_it(api, project):
    for query, field in [({"m": "reward mean!"}, "m"), ({"g": "colour"}, "g"), ({"z": "5,1"}, "z"),
                         ({"c": "config.a..b"}, "c"), ({"bogus": "1"}, "bogus"), ({"s": "2"}, "s")]:
        answer = api.get(f"/api/projects/{project.pk}/workspace/runs/", query)
        assert answer.status_code == 400, (query, answer.content)
        assert field in answer.json()["error"]["fields"], (query, answer.json())


def test_the_series_of_many_runs_share_one_grid_with_min_and_max_per_bucket(api, make_run, project, environment):
    runs = _runs(make_run, project, environment, [1e-4, 1e-3], [[], []])
    now = timezone.now()
    for offset, run in enumerate(runs):
        MetricPoint.objects.bulk_create([
            MetricPoint(run=run, step=step, name="loss", value=offset + (step % 10) / 10, recorded_at=now)
            for step in range(1, 1001)])
        metric_buckets_rebuild(run=run)

    answer = api.get(f"/api/projects/{project.pk}/workspace/series/",
                     {"runs": ",".join(str(run.pk) for run in runs), "names": "loss", "points": 50})
    assert answer.status_code == 200, answer.content
    body = answer.json()
    assert body["resolution"] > 1
    first, second = (body["series"][str(run.pk)]["loss"] for run in runs)
    assert first["x"] == second["x"]  # one grid: the runs overlay without resampling
    assert 50 <= len(first["x"]) <= 100
    assert min(first["min"]) == 0.0 and max(first["max"]) == 0.9  # each bucket spans step % 10
    assert all(low <= mean <= high for low, mean, high in zip(first["min"], first["mean"], first["max"], strict=True))
    assert sum(first["count"]) == 1000
    assert second["mean"][3] == pytest.approx(first["mean"][3] + 1)

    zoomed = api.get(f"/api/projects/{project.pk}/workspace/series/",
                     {"runs": str(runs[0].pk), "names": "loss", "points": 50, "from_step": 100,
                      "to_step": 150}).json()
    assert zoomed["resolution"] == 1 and zoomed["series"][str(runs[0].pk)]["loss"]["x"][0] == 100


def test_nothing_of_another_project_is_reachable(api, client_for, make_user, make_project, make_run, project,
                                                 environment):
    mine = _runs(make_run, project, environment, [1e-4], [[]])[0]
    outsider = make_user()
    theirs = make_project(owner=outsider)
    their_run = make_run(theirs)
    assert api.get(f"/api/projects/{theirs.pk}/workspace/runs/").status_code == 404
    assert api.get(f"/api/projects/{theirs.pk}/views/").status_code == 404
    refused = api.get(f"/api/projects/{project.pk}/workspace/series/",
                      {"runs": f"{mine.pk},{their_run.pk}", "names": "reward_mean"})
    assert refused.status_code == 400 and "runs" in refused.json()["error"]["fields"]
    assert client_for(outsider).get(f"/api/projects/{project.pk}/workspace/runs/").status_code == 404


def test_a_view_is_saved_canonical_by_name_and_only_writers_save(api, client_for, make_user, project):
    query = "z=0,200&m=reward_mean,loss&g=tag&f.metric.reward_mean=>0.5&c=metric.reward_mean&s=0.3"
    saved = api.post(f"/api/projects/{project.pk}/views/", {"name": "best runs", "query": query}, format="json")
    assert saved.status_code == 201, saved.content
    view = saved.json()
    assert view["query"] == WorkspaceView.parse(query).query()
    assert WorkspaceView.parse(view["query"]) == WorkspaceView.parse(query)
    assert view["url"].startswith(f"/projects/{project.pk}/workspace/?") and view["url"].endswith(f"view={view['id']}")

    again = api.post(f"/api/projects/{project.pk}/views/", {"name": "best runs", "query": "m=loss"}, format="json")
    assert again.status_code == 409 and "name" in again.json()["error"]["fields"]
    replaced = api.post(f"/api/projects/{project.pk}/views/", {"name": "best runs", "query": "m=loss",
                                                                "replace": True}, format="json")
    assert replaced.status_code == 201 and replaced.json()["id"] == view["id"] and replaced.json()["query"] == "m=loss"
    bad = api.post(f"/api/projects/{project.pk}/views/", {"name": "bad", "query": "x=wall"}, format="json")
    assert bad.status_code == 400 and "x" in bad.json()["error"]["fields"]

    viewer = make_user()
    from accounts.models import Membership
    from accounts.services import membership_add
    membership_add(project=project, user=viewer, role=Membership.Role.VIEWER)
    as_viewer = client_for(viewer)
    assert [item["name"] for item in as_viewer.get(f"/api/projects/{project.pk}/views/").json()["results"]] == [
        "best runs"]
    assert as_viewer.post(f"/api/projects/{project.pk}/views/", {"name": "mine", "query": ""},
                          format="json").status_code == 403
    assert as_viewer.delete(f"/api/projects/{project.pk}/views/{view['id']}/").status_code == 403
    assert api.delete(f"/api/projects/{project.pk}/views/{view['id']}/").status_code == 204


@pytest.mark.parametrize("views", [1, 12])
def test_the_saved_view_list_takes_a_fixed_number_of_queries(api, project, views, django_assert_num_queries):
    for index in range(views):
        saved_view_save(user=project.owner, project=project, name=f"view {index}", query=f"s=0.{index % 9}")
    api.get("/api/projects/")  # records the token's last use, a write that happens once a minute

    # The token with its user, the project with the caller's role, the page's count and its rows.
    with django_assert_num_queries(4):
        listed = api.get(f"/api/projects/{project.pk}/views/").json()
    assert len(listed["results"]) == views


def test_a_series_request_past_its_bucket_budget_is_refused_naming_points(api, make_run, project, environment):
    runs = _runs(make_run, project, environment, [1e-4, 1e-3], [[], []])
    ids = ",".join(str(run.pk) for run in runs)
    refused = api.get(f"/api/projects/{project.pk}/workspace/series/",
                      {"runs": ",".join([ids] * 100), "names": "a,b,c,d,e,f,g,h", "points": 2000})
    assert refused.status_code == 400 and "points" in refused.json()["error"]["fields"]
    assert api.get(f"/api/projects/{project.pk}/workspace/series/",
                   {"runs": ids, "names": "loss", "points": 2000}).status_code == 200


def test_a_nul_in_the_view_is_refused_naming_its_key(api, project):
    answer = api.get(f"/api/projects/{project.pk}/workspace/runs/", {"q": "a\x00b"})
    assert answer.status_code == 400 and "q" in answer.json()["error"]["fields"]
    saved = api.post(f"/api/projects/{project.pk}/views/", {"name": "nul", "query": "f.name=a%00b"}, format="json")
    assert saved.status_code == 400 and "f.name" in saved.json()["error"]["fields"]
