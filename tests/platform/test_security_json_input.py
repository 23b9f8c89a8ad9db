"""JSON bodies the platform cannot store or walk: a 400 naming the field, never a 500 or lost data
(issue 28, finding 8), on PostgreSQL as on SQLite (common/json_input.py); and a model's NUL bytes
and lone surrogates in trajectory samples stored escaped and read back exactly (common/stored_text.py).

Bodies are written with json.dumps, as Python clients write them: NaN and Infinity as such,
a lone surrogate as ``\\ud800``, NUL as ``\\u0000``.
"""

from __future__ import annotations

import json
import re
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.json_input import MAX_JSON_DEPTH
from tandem.contracts import TrajectorySample as TrajectorySampleRecord
from trajectories.models import TrajectorySample

from .trajectory_builders import calculator_sample

CALC_TOOL = {"name": "calc", "description": "", "parameters": {"type": "object", "properties": {}}}


def _post_json(client, path: str, body) -> object:
    return client.post(path, json.dumps(body), content_type="application/json")


def _register(api, **overrides):
    body = {"name": f"env-{uuid.uuid4().hex[:8]}", "kind": "python",
            "entrypoint": "tests.workers.maze:MazeEnvironment", "settings": {"size": 5}, "tools": [CALC_TOOL]}
    return _post_json(api, "/api/environments/", {**body, **overrides})


def _nested(depth: int):
    value: object = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def _fields(response) -> dict:
    return response.json()["error"]["fields"]


def test_deeply_nested_settings_are_a_400_not_a_recursion_error(api, project):
    # Far deeper than Python's parser goes: a RecursionError (a 500) before this check.
    body = '{"name": "deep", "entrypoint": "tests.workers.maze:MazeEnvironment", "settings": ' + \
        '{"a": ' * 100_000 + "1" + "}" * 100_000 + "}"
    response = api.post("/api/environments/", body, content_type="application/json")

    assert response.status_code == 400, response.content[:300]
    # Just past the documented depth: refused, naming the path to the level too deep.
    too_deep = _register(api, settings=_nested(MAX_JSON_DEPTH))
    assert too_deep.status_code == 400, too_deep.content[:300]
    # The body is level 1, settings level 2: its innermost object is level MAX_JSON_DEPTH + 1.
    assert list(_fields(too_deep)) == ["settings" + ".a" * (MAX_JSON_DEPTH - 1)]
    assert _register(api, settings=_nested(MAX_JSON_DEPTH - 1)).status_code == 201


@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")], ids=["NaN", "Infinity", "-Infinity"])
def test_a_number_that_is_not_finite_is_a_400_naming_it(api, project, number):
    response = _register(api, settings={"size": 5, "scale": number})

    assert response.status_code == 400, response.content[:300]
    assert list(_fields(response)) == ["settings.scale"]


def test_a_number_too_large_for_a_float_is_a_400_naming_it(api, project):
    body = json.dumps({"name": "big", "entrypoint": "tests.workers.maze:MazeEnvironment",
                       "settings": {"scale": 1}}).replace('"scale": 1', '"scale": 1e400')

    response = api.post("/api/environments/", body, content_type="application/json")

    assert response.status_code == 400, response.content[:300]
    assert list(_fields(response)) == ["settings.scale"]


@pytest.mark.parametrize("text", ["ca\x00lc", "ca\ud800lc"], ids=["NUL", "lone-surrogate"])
def test_nul_and_lone_surrogates_in_tool_names_and_arguments_are_a_400_naming_the_field(api, project, text):
    name = _register(api, tools=[{**CALC_TOOL, "name": text}])
    argument = _register(api, tools=[{**CALC_TOOL, "parameters": {"type": "object", "properties": {text: {}}}}])
    run_config = _post_json(api, "/api/runs/", {"environment": "x", "config": {"notes": {"k": text}}})

    assert name.status_code == 400, name.content[:300]
    assert list(_fields(name)) == ["tools.0.name"]
    assert argument.status_code == 400, argument.content[:300]
    assert list(_fields(argument)) == [f"tools.0.parameters.properties.{text}"]
    assert run_config.status_code == 400, run_config.content[:300]
    assert list(_fields(run_config)) == ["config.notes.k"]


def _model_output_sample(run_id: int, text: str) -> dict:
    """A calculator sample, as posted, whose model wrote ``text`` in its turns and tool call, and whose
    environment answered it (as an untrained model and a careless environment do)."""
    payload = calculator_sample(run_id).model_dump(mode="json")
    for turn in payload["turns"]:
        turn["text"] += text
        turn["spans"][0]["text"] += text
        for call in turn["tool_calls"]:
            call["name"] += text
            call["arguments"] = {**call["arguments"], text: [text]}
    payload["failure_reason"] = text
    TrajectorySampleRecord.model_validate(payload)  # a valid record
    return payload


def _post_samples(trainer_api, run_id: int, *samples: dict):
    return _post_json(trainer_api, f"/api/trainer/runs/{run_id}/trajectories/", {"samples": list(samples)})


def test_a_models_nul_bytes_and_lone_surrogates_are_stored_and_read_back_exactly(trainer_api, api, running_run):
    samples = [_model_output_sample(running_run.pk, text) for text in ("\x00\x00", "x\ud800y", "\udfff\x00\ue000")]

    response = _post_samples(trainer_api, running_run.pk, *samples)

    assert response.status_code == 202, response.content[:300]
    assert TrajectorySample.objects.filter(run=running_run).count() == len(samples)
    for sample in samples:
        detail = api.get(f"/api/runs/{running_run.pk}/trajectories/{sample['trajectory_id']}/")
        assert detail.status_code == 200, detail.content[:300]
        body = json.loads(detail.content)
        assert body["turns"] == sample["turns"]
        assert body["failure_reason"] == sample["failure_reason"]
    listed = api.get(f"/api/runs/{running_run.pk}/trajectories/")
    assert sorted(row["failure_reason"] for row in json.loads(listed.content)["results"]) == \
        sorted(sample["failure_reason"] for sample in samples)


def test_the_trajectory_page_shows_a_models_nul_bytes(trainer_api, running_run, client, user):
    sample = _model_output_sample(running_run.pk, "\x00\ud800")
    assert _post_samples(trainer_api, running_run.pk, sample).status_code == 202
    client.force_login(user)

    page = client.get(f"/runs/{running_run.pk}/trajectories/{sample['trajectory_id']}/")

    assert page.status_code == 200
    html = page.content.decode()
    # In the turns, and in the environment's failure reason (stored escaped, shown unescaped).
    failure = re.search(r'<p id="trajectory-failure"[^>]*>(.*?)</p>', html, re.S).group(1)
    assert failure.endswith(": \u2400\\ud800"), failure
    assert html.count("\u2400\\ud800") > 1
    assert "\ue000" not in html


def test_a_trajectory_post_with_a_non_finite_reward_is_a_400_naming_it(trainer_api, running_run):
    sample = calculator_sample(running_run.pk).model_dump(mode="json")

    infinite = _post_json(trainer_api, f"/api/trainer/runs/{running_run.pk}/trajectories/",
                          {"samples": [{**sample, "reward": float("inf")}]})

    assert infinite.status_code == 400
    assert list(_fields(infinite)) == ["samples.0.reward"]


# Text as a model or an environment writes it: anything, NUL and lone surrogates often.
MODEL_TEXT = st.text(st.one_of(st.characters(codec=None, exclude_categories=()),
                               st.sampled_from(["\x00", "\ud800", "\udc00", "\ue000", "0"])), max_size=40)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=MODEL_TEXT)
def test_fuzz_any_text_of_a_model_is_stored_and_read_back_exactly(trainer_api, api, running_run, text):
    sample = _model_output_sample(running_run.pk, text)

    response = _post_samples(trainer_api, running_run.pk, sample)

    assert response.status_code == 202, response.content[:300]
    detail = api.get(f"/api/runs/{running_run.pk}/trajectories/{sample['trajectory_id']}/")
    assert detail.status_code == 200
    assert json.loads(detail.content)["turns"] == sample["turns"]


# Any JSON a client could send: every number json.dumps writes (NaN, Infinity), text with NUL
# and lone surrogates, nesting up to past the depth.
ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | MODEL_TEXT,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(MODEL_TEXT, children, max_size=3),
    max_leaves=12,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(settings_value=ANY_JSON, tool_parameters=ANY_JSON, depth=st.integers(0, MAX_JSON_DEPTH + 4))
def test_fuzz_no_json_body_is_a_server_error(api, project, trainer_api, running_run, settings_value,
                                             tool_parameters, depth):
    registered = _register(api, settings=_nested(depth) if depth > MAX_JSON_DEPTH else {"v": settings_value},
                           tools=[{**CALC_TOOL, "parameters": {"type": "object", "properties": tool_parameters}}])
    sample = calculator_sample(running_run.pk).model_dump(mode="json")
    posted = _post_json(trainer_api, f"/api/trainer/runs/{running_run.pk}/trajectories/",
                        {"samples": [{**sample, "turns": [{**sample["turns"][0], "tool_calls": [
                            {"name": "calc", "arguments": {"x": settings_value}}]}, *sample["turns"][1:]]}]})

    assert registered.status_code in (201, 400), registered.content[:300]
    assert posted.status_code in (202, 400), posted.content[:300]


@pytest.mark.parametrize(("settings_text", "message"), [
    ('{"a": ' * 100_000 + "1" + "}" * 100_000, "Nested deeper than"),
    ('{"scale": 1e400}', "scale: inf is not a finite number"),
    ('{"name": "ca\\u0000lc"}', "name: The text holds a NUL character"),
], ids=["deep", "1e400", "NUL"])
def test_the_environment_forms_json_is_checked_as_the_apis_is(client, user, project, settings_text, message):
    client.force_login(user)

    response = client.post("/environments/", {
        "project": project.pk, "name": "maze", "kind": "python", "entrypoint": "tests.workers.maze:MazeEnvironment",
        "settings": settings_text, "tools": ""})

    assert response.status_code == 200
    assert message in response.content.decode()
