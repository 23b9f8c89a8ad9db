"""The new-run page: a form generated from RunConfig's schema, errors inline, environment health."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from environment_registry.builtin import CALCULATOR
from environment_registry.models import EnvironmentVersion
from environment_registry.services import environment_probe_record, environment_register
from runs.config_form import config_fields, config_form, form_state
from runs.models import Run
from tandem.configs.run import RunConfig

from .conftest import probe_report


def _logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def browser(user) -> Client:
    return _logged_in(user)


def _form_data(environment, name: str = "", rows: dict | None = None, sections_on=(), **values) -> dict:
    """The form as the page renders it (every input at its default), with ``values`` changed."""
    data = {"environment": f"{environment.project_id}:{environment.name}@1", "name": name}
    data.update(_config_inputs(form_state(config_form())))
    for path in sections_on:
        data["config." + path] = "on"
    for path, items in (rows or {}).items():
        for index, item in enumerate(items):
            for cell, text in item.items():
                data[f"config.{path}.{index}.{cell}"] = text
    for path, value in values.items():
        data["config." + path.replace("__", ".")] = value
    return data


def _config_inputs(state) -> dict:
    """What a browser posts for the inputs of ``state``: checked boxes only, toggles of sections that are on."""
    fields = {field.path: field for field in config_fields()}
    data = {}
    for path, text in state.texts.items():
        if fields[path].widget != "checkbox":
            data["config." + path] = text
        elif text == "true":
            data["config." + path] = "true"
    data.update({"config." + path: "on" for path, on in state.sections_on.items() if on})
    for path, items in state.rows.items():
        for index, item in enumerate(items):
            data.update({f"config.{path}.{index}.{cell}": text for cell, text in item.items()})
    return data


def _field_block(html: str, path: str) -> str:
    """The rendered block of one config field (label, input, help, errors)."""
    match = re.search(rf'<div class="config-field[^"]*" data-path="{re.escape(path)}"[^>]*>(.*?)</div>', html, re.S)
    assert match, f"no field {path} on the page"
    return match.group(0)


def test_the_page_renders_the_basics_open_and_every_section_folded_with_every_field(browser, environment):
    response = browser.get("/runs/new/")
    html = response.content.decode()

    assert response.status_code == 200
    form = config_form()
    assert '<fieldset class="config-section basic" id="config-section-basics"' in html
    for section in form.advanced:
        # Folded: a <details> without "open".
        assert re.search(rf'<details class="config-section" id="{section.html_id}" data-path="{section.path}">', html)
    for section in form.optional_sections:
        assert f'name="{section.input_name}" id="{section.input_id}" value="on" data-section-toggle>' in html
    for field in config_fields():
        if field.widget == "rows":
            assert f'data-rows="{field.path}"' in html
        else:
            assert f'name="{field.input_name}"' in html
    epsilon = _field_block(html, "algorithm.epsilon_low")
    assert 'data-exclusive-min="0"' in epsilon and 'data-exclusive-max="1"' in epsilon
    assert "Epsilon low" in epsilon and "Lower clip range" in epsilon and "default 0.2" in epsilon
    assert "RL learning rate" in _field_block(html, "rl_learning_rate")
    name = _field_block(html, "algorithm.name")
    assert '<option value="dapo"' in name and '<option value="grpo" selected>' in name
    assert 'type="checkbox" name="config.lora.enabled"' in _field_block(html, "lora.enabled")
    # Lists of scalars are text, one per line or comma-separated; no JSON boxes but free-form dicts.
    assert 'data-list="line"' in _field_block(html, "sampling.stop_strings")
    assert 'data-list="comma"' in _field_block(html, "evaluation.pass_k")
    assert html.count('data-json="true"') == 2
    # Repeatable rows: a template for a new row, and a button that adds one.
    assert 'name="config.sft.datasets.__index__.weight"' in html
    assert 'data-rows-add="sft.datasets"' in html and 'data-rows-add="evaluation.datasets"' in html
    # Presets: each algorithm and the fast demo (no SmolLM2 under this test's model roots).
    for key in ("algorithm-dapo", "algorithm-ppo", "fast-demo"):
        assert f'id="preset-{key}"' in html
    assert 'id="review-run"' in html and 'id="start-run"' in html


def test_the_real_model_preset_is_offered_where_smollm2_is_installed(browser, environment, settings, tmp_path):
    model = tmp_path / "smollm2-135m-instruct"
    model.mkdir()
    (model / "config.json").write_text("{}")
    settings.TANDEM_MODEL_ROOTS = (tmp_path,)

    html = browser.get("/runs/new/").content.decode()

    assert 'id="preset-real-model"' in html and "Real model (SmolLM2-135M-Instruct)" in html
    assert f'<option value="{model}">' in html  # offered for model.hf_checkpoint too


def test_the_runs_list_links_to_the_new_run_page(browser, environment):
    html = browser.get("/runs/").content.decode()

    assert 'id="new-run-link" ' in html and 'href="/runs/new/"' in html


def test_a_bad_value_comes_back_inline_at_its_field_with_the_input_kept(browser, environment):
    response = browser.post(
        "/runs/new/",
        _form_data(environment, algorithm__epsilon_high="11", rl_steps="7", name="mine"),
    )
    html = response.content.decode()

    assert response.status_code == 400
    assert not Run.objects.exists()
    block = _field_block(html, "algorithm.epsilon_high")
    assert 'class="config-field has-error"' in block
    assert "less than or equal to 10" in block
    assert 'value="11"' in block
    assert 'value="7"' in _field_block(html, "rl_steps")  # the rest of the input is kept too
    assert 'value="mine"' in html
    assert "has-error" not in _field_block(html, "rl_steps")


def test_a_sections_own_rule_shows_on_its_fieldset(browser, environment):
    response = browser.post("/runs/new/", _form_data(environment, model__num_heads="3"))
    html = response.content.decode()

    assert response.status_code == 400
    section = html.split('id="config-section-model"', 1)[1]
    assert section.split(">", 1)[0].endswith(" open")  # a folded section with an error opens
    assert section.split("</summary>", 1)[1].split('<div class="section-body"', 1)[0].count(
        "num_heads must divide d_model") == 1


def test_every_error_comes_back_at_once_each_at_its_field_and_listed_by_label(browser, environment):
    response = browser.post("/runs/new/", _form_data(
        environment, sections_on=["evaluation"], name="several",
        model__rope_scaling="{oops", evaluation__pass_k="1, two", algorithm__epsilon_high="11",
        rl_learning_rate="5", model__num_heads="3", rl_steps="8"))
    html = response.content.decode()

    assert response.status_code == 400 and not Run.objects.exists()
    # The inputs that did not parse, and RunConfig's verdict on all the rest, together.
    assert "Not valid JSON" in _field_block(html, "model.rope_scaling")
    assert "two: not a whole number." in _field_block(html, "evaluation.pass_k")
    assert "less than or equal to 10" in _field_block(html, "algorithm.epsilon_high")
    assert "less than or equal to 1" in _field_block(html, "rl_learning_rate")
    for path in ("model.rope_scaling", "evaluation.pass_k", "algorithm.epsilon_high", "rl_learning_rate"):
        assert 'class="config-field has-error"' in _field_block(html, path), path
    assert "has-error" not in _field_block(html, "rl_steps") and 'value="8"' in _field_block(html, "rl_steps")
    summary = html.split('id="form-error-list"', 1)[1].split("</ul>", 1)[0]
    assert '<span id="form-error-count">5</span> errors' in html
    for label, target in (("RL learning rate", "id_config_rl_learning_rate"), ("pass@k", "id_config_evaluation__pass_k"),
                          ("RoPE scaling", "id_config_model__rope_scaling"), ("Model", "config-section-model"),
                          ("Epsilon high", "id_config_algorithm__epsilon_high")):
        assert f'<a href="#{target}" data-target="{target}">{label}</a>: ' in summary, label
    # The folded sections holding them open; the others stay folded.
    assert re.search(r'<details class="config-section" id="config-section-algorithm" data-path="algorithm" open>', html)
    assert re.search(r'<details class="config-section" id="config-section-rollout" data-path="rollout">', html)


def test_a_rows_error_shows_at_its_cell_and_a_rule_over_rows_on_the_section(browser, environment):
    rows = {"sft.datasets": [{"name": "chats", "version": "", "weight": "1"},
                             {"name": "other", "version": "", "weight": "0"}]}
    response = browser.post("/runs/new/", _form_data(environment, rows=rows))
    twice = browser.post("/runs/new/", _form_data(environment, rows={"sft.datasets": [
        {"name": "chats", "version": "", "weight": "1"}, {"name": "chats", "version": "", "weight": "2"}]}))
    html = response.content.decode()

    assert response.status_code == 400
    cell = _field_block(html, "sft.datasets.1.weight")
    assert "has-error" in cell and "greater than 0" in cell and 'value="0"' in cell
    assert "has-error" not in _field_block(html, "sft.datasets.0.weight")
    assert "SFT datasets, row 2: Weight</a>" in html
    assert "listed twice" in twice.content.decode().split('id="config-section-sft"', 1)[1].split("section-body", 1)[0]


def test_a_good_form_creates_a_run_that_stores_only_the_changes_over_defaults(browser, environment):
    response = browser.post(
        "/runs/new/",
        _form_data(environment, rl_steps="7", algorithm__epsilon_high="0.28", model__qk_norm="true",
                   name="tuned"),
    )

    run = Run.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/runs/{run.pk}/"
    assert run.name == "tuned" and run.environment == environment
    expected = RunConfig.model_validate(
        {"rl_steps": 7, "algorithm": {"epsilon_high": 0.28}, "model": {"qk_norm": True}}
    ).model_dump(mode="json")
    assert run.config == expected
    defaults = RunConfig().model_dump(mode="json")
    differing = {key for key in defaults if run.config[key] != defaults[key]}
    assert differing == {"rl_steps", "algorithm", "model"}


def test_clone_prefills_the_form_from_a_run(browser, make_run, project, environment):
    source = make_run(project, environment=environment, name="base",
                      config={"rl_steps": 9, "model": {"d_model": 128}, "sampling": {"stop_strings": ["END"]}})

    html = browser.get(f"/runs/new/?clone={source.pk}").content.decode()

    assert 'value="base (clone)"' in html
    assert 'value="9"' in _field_block(html, "rl_steps")
    assert 'value="128"' in _field_block(html, "model.d_model")
    assert ">END</textarea>" in _field_block(html, "sampling.stop_strings")
    assert f'value="{project.pk}:{environment.name}@1" data-status="ready"' in html
    assert re.search(rf'value="{project.pk}:{environment.name}@1"[^>]*selected', html)
    # The JSON clone page leads to this form, and back.
    assert f'href="/runs/{source.pk}/clone/"' in html
    assert f'href="/runs/new/?clone={source.pk}"' in browser.get(f"/runs/{source.pk}/clone/").content.decode()


def test_a_cloned_form_posted_as_is_creates_the_same_config(browser, make_run, project, environment):
    source = make_run(project, environment=environment,
                      config={"rl_steps": 9, "algorithm": {"name": "dapo", "epsilon_high": 0.2},
                              "lora": {"enabled": True}, "evaluation": {"pass_k": [1, 2]},
                              "sampling": {"stop_strings": ["</answer>", "a, b"]}})
    data = {"environment": f"{environment.project_id}:{environment.name}@1", "name": "copy",
            **_config_inputs(form_state(config_form(), source.config))}

    browser.post(f"/runs/new/?clone={source.pk}", data)

    clone = Run.objects.exclude(pk=source.pk).get()
    assert clone.config == source.config


def test_a_viewer_gets_403(make_user, make_project, make_environment):
    viewer = make_user("vera")
    project = make_project(viewers=[viewer])
    environment = make_environment(project)
    client = _logged_in(viewer)

    assert client.get("/runs/new/").status_code == 403
    assert client.post("/runs/new/", _form_data(environment)).status_code == 403
    assert not Run.objects.exists()


def test_a_viewer_cannot_start_a_run_in_a_project_where_it_only_views(make_user, make_project, make_environment, user):
    # alice writes in her own project but only views this one: the service refuses, as over the API.
    project = make_project(viewers=[user])
    make_project(owner=user)
    environment = make_environment(project)

    response = _logged_in(user).post("/runs/new/", _form_data(environment))

    assert response.status_code == 403 and not Run.objects.exists()


def test_the_picker_shows_each_versions_health_and_refuses_failed_ones(browser, project, environment):
    failing = environment_register(user=project.owner, project=project, spec=CALCULATOR.model_copy(update={"name": "flaky"}))
    environment_probe_record(report=probe_report(failing.probes.get(), failed_check="step"))
    failing.refresh_from_db()
    pending = environment_register(user=project.owner, project=project, spec=CALCULATOR.model_copy(update={"name": "fresh"}))
    assert failing.status == EnvironmentVersion.Status.FAILED

    html = browser.get("/runs/new/").content.decode()

    flaky = re.search(rf'<option value="{project.pk}:flaky@1"[^>]*>', html).group(0)
    assert 'data-status="failed"' in flaky and " disabled" in flaky
    assert re.search(r'data-reason="[^"]*step[^"]*"', flaky)
    assert 'data-probed-at="20' in flaky
    fresh = re.search(rf'<option value="{project.pk}:fresh@1"[^>]*>', html).group(0)
    assert 'data-status="pending"' in fresh and "disabled" not in fresh
    # The first pickable version is picked, and its health is shown next to the picker.
    health = html.split('id="environment-health"', 1)[1].split("</div>\n      </div>", 1)[0]
    assert 'class="badge badge-ready"' in health and "Ready" in health
    assert "ago" in health
    assert pending.status == EnvironmentVersion.Status.PENDING

    response = browser.post("/runs/new/", {**_form_data(environment), "environment": f"{project.pk}:flaky@1"})
    assert response.status_code == 400 and not Run.objects.exists()
    assert "failed its probe" in response.content.decode().split('id="id_environment"', 1)[1].split("</div>", 1)[0]


def test_cloning_another_projects_run_is_404(browser, environment, make_run):
    stranger_run = make_run()  # a project alice does not belong to

    assert browser.get(f"/runs/new/?clone={stranger_run.pk}").status_code == 404


def test_the_validation_endpoint_names_fields_and_sections_and_creates_nothing(browser, environment):
    bad_field = browser.post("/runs/new/validate/", _form_data(environment, algorithm__epsilon_high="11"))
    bad_section = browser.post("/runs/new/validate/", _form_data(environment, model__num_heads="3"))
    good = browser.post("/runs/new/validate/", _form_data(environment, rl_steps="3"))
    bad_rollout = browser.post("/runs/new/validate/", _form_data(environment, rollout__groups_per_task="100"))

    assert bad_field.status_code == 200
    assert list(bad_field.json()["errors"]) == ["algorithm.epsilon_high"]
    assert "less than or equal to 10" in bad_field.json()["errors"]["algorithm.epsilon_high"][0]
    assert bad_field.json()["review"] == []
    assert "num_heads must divide d_model" in bad_section.json()["errors"]["model"][0]
    assert good.json() == {"errors": {}, "form_errors": [], "review": [
        {"path": "rl_steps", "label": "RL steps", "default": "40", "value": "3"}]}
    assert "rollout.groups_per_task must be at most" in bad_rollout.json()["errors"]["rollout"][0]
    assert not Run.objects.exists()


def test_a_malformed_json_field_does_not_hide_the_other_errors(browser, environment):
    # The bug of issue 18: one bad JSON field was the only error reported, and fields flagged
    # before came back unmarked.
    response = browser.post("/runs/new/validate/", _form_data(
        environment, model__rope_scaling="[x", model__chat_template_kwargs="{", algorithm__epsilon_high="11",
        model__num_heads="3"))

    errors = response.json()["errors"]
    assert sorted(errors) == ["algorithm.epsilon_high", "model", "model.chat_template_kwargs", "model.rope_scaling"]
    assert errors["model.rope_scaling"][0].startswith("Not valid JSON")


def test_the_validation_endpoint_needs_a_login(client, environment):
    response = client.post("/runs/new/validate/", _form_data(environment))

    assert response.status_code == 302 and response["Location"].startswith("/login/")
