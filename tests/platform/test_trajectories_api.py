"""The trajectory samples API: the trainer's posts, and project-scoped reads with filters and pages."""

from __future__ import annotations

from rest_framework.test import APIClient

from runs.services import run_claim_next
from trajectories.models import TrajectorySample

from .trajectory_builders import calculator_sample, post_body, tool_use_sample


def _trainer_named(trainer, name: str) -> APIClient:
    """The trainer's client as another trainer process (each holds one run at a time)."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {trainer.raw_token}", HTTP_X_TANDEM_TRAINER=name)
    return client


def _post(trainer_api, run_id: int, *samples):
    return trainer_api.post(f"/api/trainer/runs/{run_id}/trajectories/", post_body(*samples), format="json")


def test_posted_samples_are_stored_once_and_read_back_turn_by_turn(trainer_api, api, running_run):
    sample = calculator_sample(running_run.pk, step=4)

    first = _post(trainer_api, running_run.pk, sample)
    retried = _post(trainer_api, running_run.pk, sample)

    assert first.status_code == 202, first.content
    assert first.json() == {"stored": 1} and retried.json() == {"stored": 1}
    assert TrajectorySample.objects.filter(run=running_run).count() == 1
    detail = api.get(f"/api/runs/{running_run.pk}/trajectories/{sample.trajectory_id}/")
    assert detail.status_code == 200, detail.content
    body = detail.json()
    assert body["id"] == sample.trajectory_id and body["step"] == 4 and body["status"] == "ok"
    assert body["policy_versions"] == [3, 4] and body["num_turns"] == 2
    assert [turn["role"] for turn in body["turns"]] == ["prompt", "policy", "tool", "policy"]
    assert body["turns"][1]["tool_calls"] == [{"name": "calc", "arguments": {"expression": "2+3"}, "copies_example": False}]
    assert [span["trained"] for turn in body["turns"] for span in turn["spans"]] == [False, True, False, True]
    assert body["trained_tokens"] == 12 and body["num_tokens"] == 37


def test_only_staff_post_samples_and_only_for_the_run_they_name(api, trainer, trainer_api, running_run, make_run):
    other = make_run()
    assert run_claim_next(worker="trainer-host:2").pk == other.pk
    sample = calculator_sample(running_run.pk)

    assert _post(api, running_run.pk, sample).status_code == 403
    # The trainer holding ``other`` posts a sample of another run to it.
    wrong_run = _post(_trainer_named(trainer, "trainer-host:2"), other.pk, sample)
    assert wrong_run.status_code == 400
    assert list(wrong_run.json()["error"]["fields"]) == ["samples.0.run_id"]
    broken = post_body(sample)
    broken["samples"][0]["num_tokens"] = 3
    invalid = trainer_api.post(f"/api/trainer/runs/{running_run.pk}/trajectories/", broken, format="json")
    assert invalid.status_code == 400
    assert "samples.0" in next(iter(invalid.json()["error"]["fields"]))
    assert TrajectorySample.objects.count() == 0


def test_another_projects_run_and_its_trajectories_are_not_found(
    trainer_api, client_for, make_user, running_run
):
    sample = calculator_sample(running_run.pk)
    _post(trainer_api, running_run.pk, sample)
    stranger = client_for(make_user("mallory"))

    listing = stranger.get(f"/api/runs/{running_run.pk}/trajectories/")
    detail = stranger.get(f"/api/runs/{running_run.pk}/trajectories/{sample.trajectory_id}/")

    assert listing.status_code == 404 and detail.status_code == 404
    assert listing.json()["error"]["code"] == "not_found"


def test_a_trajectory_of_another_run_is_not_found_under_this_one(
    api, trainer, running_run, make_run, project, environment
):
    other_run = make_run(project, environment=environment)
    assert run_claim_next(worker="trainer-host:2").pk == other_run.pk
    sample = calculator_sample(other_run.pk)
    assert _post(_trainer_named(trainer, "trainer-host:2"), other_run.pk, sample).status_code == 202

    response = api.get(f"/api/runs/{running_run.pk}/trajectories/{sample.trajectory_id}/")

    assert response.status_code == 404


def test_the_list_filters_by_status_environment_and_reward_range(api, trainer_api, running_run):
    samples = [
        calculator_sample(running_run.pk, step=1, reward=0.0, why="worst"),
        calculator_sample(running_run.pk, step=1, reward=1.0),
        calculator_sample(running_run.pk, step=2, reward=0.5, environment="calculator-hard"),
        calculator_sample(running_run.pk, step=2, status="failed", why="failed"),
    ]
    assert _post(trainer_api, running_run.pk, *samples).status_code == 202
    url = f"/api/runs/{running_run.pk}/trajectories/"

    def ids(**query):
        response = api.get(url, query)
        assert response.status_code == 200, response.content
        return {row["id"] for row in response.json()["results"]}

    every = {sample.trajectory_id for sample in samples}
    assert ids() == every
    assert ids(status="failed") == {samples[3].trajectory_id}
    assert ids(status="ok") == every - {samples[3].trajectory_id}
    assert ids(environment="calculator-hard") == {samples[2].trajectory_id}
    assert ids(min_reward=0.5) == {samples[1].trajectory_id, samples[2].trajectory_id}
    assert ids(min_reward=0.1, max_reward=0.9) == {samples[2].trajectory_id}
    assert ids(max_reward=0.0) == {samples[0].trajectory_id, samples[3].trajectory_id}
    first = api.get(url).json()["results"]
    assert [row["step"] for row in first] == [2, 2, 1, 1]  # newest step first
    assert "turns" not in first[0]

    bad = api.get(url, {"status": "lost", "min_reward": "lots"})
    assert bad.status_code == 400
    assert set(bad.json()["error"]["fields"]) == {"status", "min_reward"}


def test_the_list_pages_with_a_fixed_number_of_queries(
    api, trainer_api, running_run, django_assert_num_queries
):
    samples = [calculator_sample(running_run.pk, step=step) for step in range(1, 8)]
    assert _post(trainer_api, running_run.pk, *samples).status_code == 202
    url = f"/api/runs/{running_run.pk}/trajectories/"
    api.get("/api/projects/")  # records the token's last use, a write that happens once a minute

    # The token, the run, the count and the page: however many samples the page holds.
    with django_assert_num_queries(4):
        first = api.get(url, {"page_size": 3}).json()
    with django_assert_num_queries(4):
        last = api.get(url, {"page_size": 3, "page": 3}).json()

    assert first["count"] == 7 and len(first["results"]) == 3 and first["next"] is not None
    assert [row["step"] for row in first["results"]] == [7, 6, 5]
    assert [row["step"] for row in last["results"]] == [1] and last["next"] is None


def test_evaluation_episodes_are_told_apart_from_trained_ones_and_filtered(api, trainer_api, running_run, user):
    from django.test import Client

    from trajectories.models import TrajectorySample as Stored

    trained = calculator_sample(running_run.pk, step=3)
    evaluated = calculator_sample(running_run.pk, step=3).model_copy(update={"purpose": "evaluation"})
    assert _post(trainer_api, running_run.pk, trained, evaluated).status_code == 202
    url = f"/api/runs/{running_run.pk}/trajectories/"

    def rows(**query):
        response = api.get(url, query)
        assert response.status_code == 200, response.content
        return {row["id"]: row["purpose"] for row in response.json()["results"]}

    assert rows() == {trained.trajectory_id: "training", evaluated.trajectory_id: "evaluation"}
    assert rows(purpose="evaluation") == {evaluated.trajectory_id: "evaluation"}
    assert rows(purpose="training") == {trained.trajectory_id: "training"}
    assert api.get(url, {"purpose": "holdout"}).status_code == 400
    assert Stored.objects.get(trajectory_id=evaluated.trajectory_id).payload["purpose"] == "evaluation"

    browser = Client()
    browser.force_login(user)
    page = browser.get(f"/runs/{running_run.pk}/trajectories/?purpose=evaluation").content.decode()
    assert 'data-purpose="evaluation"' in page and 'data-purpose="training"' not in page


def test_the_search_finds_text_in_any_turn_in_any_case_and_pages(api, trainer_api, running_run):
    addition = calculator_sample(running_run.pk, step=1, question="What is 2+3?", expression="2+3", answer="5")
    product = calculator_sample(running_run.pk, step=2, question="What is 6*7?", expression="6*7", answer="42")
    other_product = calculator_sample(running_run.pk, step=3, question="Multiply 6*7 please", expression="6*7",
                                      answer="42")
    assert _post(trainer_api, running_run.pk, addition, product, other_product).status_code == 202
    url = f"/api/runs/{running_run.pk}/trajectories/"

    def ids(**query):
        response = api.get(url, query)
        assert response.status_code == 200, response.content
        return [row["id"] for row in response.json()["results"]]

    assert ids(q="6*7") == [other_product.trajectory_id, product.trajectory_id]
    assert ids(q="MULTIPLY") == [other_product.trajectory_id]  # any case
    assert ids(q="42", status="ok") == [other_product.trajectory_id, product.trajectory_id]  # a tool turn's text
    assert ids(q="nowhere in any turn") == []
    paged = api.get(url, {"q": "6*7", "page_size": 1}).json()
    assert paged["count"] == 2 and len(paged["results"]) == 1 and paged["next"] is not None
    assert api.get(url, {"q": "x" * 201}).json()["error"]["fields"].keys() == {"q"}


def test_a_search_costs_the_same_queries_as_the_plain_list(api, trainer_api, running_run, django_assert_num_queries):
    samples = [calculator_sample(running_run.pk, step=step) for step in range(1, 6)]
    assert _post(trainer_api, running_run.pk, *samples).status_code == 202
    api.get("/api/projects/")  # records the token's last use, a write that happens once a minute

    with django_assert_num_queries(4):
        found = api.get(f"/api/runs/{running_run.pk}/trajectories/", {"q": "what is", "page_size": 2}).json()

    assert found["count"] == 5 and len(found["results"]) == 2


def test_the_group_endpoint_gives_every_sampled_episode_with_rewards_and_advantages(
    api, trainer_api, running_run, django_assert_num_queries
):
    group = f"{running_run.pk}-7"
    winner = calculator_sample(running_run.pk, step=4, why="group", group_id=group, reward=1.0, advantage=1.2)
    loser = calculator_sample(running_run.pk, step=4, why="group", group_id=group, reward=0.0, advantage=-0.4)
    middling = calculator_sample(running_run.pk, step=4, why="group", group_id=group, reward=0.5, advantage=0.1)
    failed = calculator_sample(running_run.pk, step=4, why="group", group_id=group, status="failed")
    elsewhere = calculator_sample(running_run.pk, step=4, group_id=f"{running_run.pk}-8")
    assert _post(trainer_api, running_run.pk, winner, loser, middling, failed, elsewhere).status_code == 202
    api.get("/api/projects/")  # records the token's last use, a write that happens once a minute

    # The token, the run and the group's samples.
    with django_assert_num_queries(3):
        response = api.get(f"/api/runs/{running_run.pk}/trajectory-groups/{group}/")

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["group_id"] == group and body["group_size"] == 4 and body["steps"] == [4]
    # Highest advantage first; the failed episode, never trained on, has none and comes last.
    assert [(row["id"], row["reward"], row["advantage"]) for row in body["episodes"]] == [
        (winner.trajectory_id, 1.0, 1.2), (middling.trajectory_id, 0.5, 0.1), (loser.trajectory_id, 0.0, -0.4),
        (failed.trajectory_id, 0.0, None),
    ]
    first_policy_span = body["episodes"][0]["turns"][1]["spans"][0]
    assert first_policy_span["advantages"] == [1.2] * first_policy_span["tokens"]
    assert api.get(f"/api/runs/{running_run.pk}/trajectory-groups/no-such-group/").status_code == 404


def test_another_projects_user_does_not_find_a_group(trainer_api, client_for, make_user, running_run):
    sample = calculator_sample(running_run.pk)
    _post(trainer_api, running_run.pk, sample)
    stranger = client_for(make_user("mallory"))

    response = stranger.get(f"/api/runs/{running_run.pk}/trajectory-groups/{sample.group_id}/")

    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


def test_a_sample_stored_before_per_token_values_is_still_served_without_them(api, running_run, user):
    from django.test import Client

    from trajectories.services import trajectory_samples_record

    from .trajectory_builders import schema_1_payload

    sample = calculator_sample(running_run.pk, step=2)
    trajectory_samples_record(run=running_run, samples=[sample])
    TrajectorySample.objects.filter(trajectory_id=sample.trajectory_id).update(payload=schema_1_payload(sample))

    body = api.get(f"/api/runs/{running_run.pk}/trajectories/{sample.trajectory_id}/").json()

    assert body["token_values"] == "not_recorded"
    assert [span["text"] for turn in body["turns"] for span in turn["spans"]][1] == "calc(2+3)⟨eos⟩"
    assert all(span["logprobs"] == [] and span["pieces"] == [] for turn in body["turns"] for span in turn["spans"])
    browser = Client()
    browser.force_login(user)
    page = browser.get(f"/runs/{running_run.pk}/trajectories/{sample.trajectory_id}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="token-values-note"' in html and 'class="tok"' not in html and "calc(2+3)" in html


def test_the_pages_search_and_link_a_sample_to_its_group(api, trainer_api, running_run, user):
    from django.test import Client

    found = calculator_sample(running_run.pk, question="What is 6*7?", expression="6*7", answer="42",
                              why="group", advantage=0.5)
    missed = calculator_sample(running_run.pk)
    assert _post(trainer_api, running_run.pk, found, missed).status_code == 202
    browser = Client()
    browser.force_login(user)

    listing = browser.get(f"/runs/{running_run.pk}/trajectories/", {"q": "6*7"}).content.decode()
    group = browser.get(f"/runs/{running_run.pk}/trajectory-groups/{found.group_id}/")

    assert found.trajectory_id[:10] in listing and missed.trajectory_id[:10] not in listing
    assert f"/runs/{running_run.pk}/trajectory-groups/{found.group_id}/" in listing
    assert group.status_code == 200 and group.content.decode().count('class="group-episode card"') == 2
    assert browser.get(f"/runs/{running_run.pk}/trajectory-groups/nothing/").status_code == 404


def test_the_list_filters_by_tool_use_and_the_page_says_why_a_call_came_to_nothing(
    api, trainer_api, running_run, user
):
    from django.test import Client

    called, unparsed, answered = (tool_use_sample(running_run.pk, first_turn=first_turn)
                                  for first_turn in ("ok", "unparsed", "answer"))
    assert _post(trainer_api, running_run.pk, called, unparsed, answered).status_code == 202
    url = f"/api/runs/{running_run.pk}/trajectories/"

    def ids(**query):
        response = api.get(url, query)
        assert response.status_code == 200, response.content
        return {row["id"] for row in response.json()["results"]}

    assert ids(tool_use="called") == {called.trajectory_id}
    assert ids(tool_use="not_called") == {unparsed.trajectory_id, answered.trajectory_id}
    assert ids(tool_use="unparsed") == ids(tool_use="failed") == {unparsed.trajectory_id}
    bad = api.get(url, {"tool_use": "sometimes"})
    assert bad.status_code == 400 and set(bad.json()["error"]["fields"]) == {"tool_use"}
    detail = api.get(f"{url}{unparsed.trajectory_id}/").json()
    assert detail["turns"][1]["tool_call_status"] == "unparsed"

    browser = Client()
    browser.force_login(user)
    listing = browser.get(f"/runs/{running_run.pk}/trajectories/", {"tool_use": "unparsed"}).content.decode()
    assert unparsed.trajectory_id[:10] in listing and called.trajectory_id[:10] not in listing
    assert '<option value="unparsed" selected>a call failed to parse</option>' in listing
    page = browser.get(f"/runs/{running_run.pk}/trajectories/{unparsed.trajectory_id}/").content.decode()
    assert 'class="badge badge-failed">unparsed</span>' in page and "the call markup is not closed" in page


def test_the_migration_counts_the_calls_of_samples_stored_before_the_tool_use_fields(trainer_api, running_run):
    import importlib

    from django.apps import apps

    called, answered = (tool_use_sample(running_run.pk, first_turn=first_turn) for first_turn in ("ok", "answer"))
    _post(trainer_api, running_run.pk, called, answered)
    TrajectorySample.objects.update(tool_calls_run=0)  # as the rows stood before migration 0005

    migration = importlib.import_module("trajectories.migrations.0005_sample_tool_use")
    migration._count_tool_use(apps, None)

    counts = dict(TrajectorySample.objects.values_list("trajectory_id", "tool_calls_run"))
    assert counts == {called.trajectory_id: 1, answered.trajectory_id: 0}


def test_an_agent_programs_calls_are_on_its_policy_turns_and_its_replayed_history_is_prompt(
    api, trainer_api, running_run, user
):
    from django.test import Client

    from .trajectory_builders import agent_program_sample

    sample = agent_program_sample(running_run.pk)
    assert _post(trainer_api, running_run.pk, sample).status_code == 202
    body = api.get(f"/api/runs/{running_run.pk}/trajectories/{sample.trajectory_id}/").json()
    # Chain 0: the prompt, the first call and its result, the second call; chain 1: the rewritten history
    # (the user's message, the second call given back, as context now, and its result) and the answer.
    assert [turn["role"] for turn in body["turns"]] == \
        ["prompt", "policy", "tool", "policy", "prompt", "prompt", "tool", "policy"]
    assert body["turns"][5]["text"] == "calc(5*1)" and not any(span["trained"] for span in body["turns"][5]["spans"])
    policy = [turn for turn in body["turns"] if turn["role"] == "policy"]
    assert [turn["agent_call"]["chain"] for turn in policy] == [0, 0, 1]
    assert [turn["agent_call"]["completion_tokens"] for turn in policy] == [10, 10, 2]
    assert all(span["trained"] == (turn["role"] == "policy") for turn in body["turns"] for span in turn["spans"])
    assert body["trained_tokens"] == 22 and body["policy_versions"] == [2, 2, 2]
    # The given-back call is not counted again among the calls that ran.
    assert TrajectorySample.objects.get(trajectory_id=sample.trajectory_id).tool_calls_run == 2

    browser = Client()
    browser.force_login(user)
    page = browser.get(f"/runs/{running_run.pk}/trajectories/{sample.trajectory_id}/").content.decode()
    assert page.count('class="agent-call muted small"') == 3
    assert 'data-chain="1">agent call, chain 1: ' in page and "2 completion tokens" in page
