"""The new-run form's tree, generated from RunConfig's JSON schema, and how a submitted form is read."""

from __future__ import annotations

from django.http import QueryDict

from runs.config_form import BASIC_PATHS, config_fields, config_form, config_from_form, form_state
from runs.config_form_presets import algorithm_presets, config_review, form_presets, preset_inputs
from runs.config_labels import config_label
from tandem.configs.demo_runs import SHORT_RUN_CONFIG
from tandem.configs.run import RunConfig


def _leaf_paths(model_schema: dict, root: dict, prefix: str = "") -> set[str]:
    """Every leaf field of the schema, walked independently of the builder: nested models (optional
    ones too) are sections, lists of objects one input, everything else one input."""
    paths = set()
    for name, prop in model_schema["properties"].items():
        refs = [variant["$ref"] for variant in prop.get("anyOf", [prop]) if "$ref" in variant]
        if refs:
            target = root["$defs"][refs[0].rsplit("/", 1)[1]]
            paths |= _leaf_paths(target, root, f"{prefix}{name}.")
        else:
            paths.add(prefix + name)
    return paths


def _by_path():
    return {field.path: field for field in config_fields()}


def test_every_run_config_field_appears_once_with_its_dotted_name():
    schema = RunConfig.model_json_schema()
    paths = [field.path for field in config_fields()]

    assert len(paths) == len(set(paths))
    # schema_version is not an input: the form always posts the current shape.
    assert set(paths) == _leaf_paths(schema, schema) - {"schema_version"}
    assert {"seed", "model.d_model", "algorithm.epsilon_high", "lora.rank", "evaluation.pass_k",
            "algorithm.kl.coef", "sft.datasets"} <= set(paths)


def test_the_basics_come_first_and_the_configs_sections_follow_folded():
    form = config_form()

    assert [child.path for child in form.basic.children] == list(BASIC_PATHS)
    assert form.basic.html_id == "config-section-basics"
    assert [section.path for section in form.advanced] == [
        "", "algorithm", "model", "sampling", "rollout", "sft", "optimizer", "schedule", "memory", "lora", "mesh",
        "stream", "checkpoint", "weights"]
    run = form.advanced[0]
    assert run.title == "Run" and run.html_id == "config-section-run"
    assert [field.path for field in run.fields] == [
        "seed", "sft_batch_size", "trajectory_samples_per_step", "trajectory_sample_groups_per_step", "max_restarts",
        "stall_timeout_s"]
    sections = {section.path: section for section in form.advanced}
    assert sections["lora"].title == "LoRA" and sections["sft"].title == "SFT"
    assert sections["model"].description == "Policy architecture."
    # A basic field is not shown twice: the algorithm's name is in the basics only.
    assert "algorithm.name" not in [field.path for field in sections["algorithm"].fields]


def test_optional_sections_are_fieldsets_with_a_toggle_not_json_boxes():
    form = config_form()
    optional = {section.path: section for section in form.optional_sections}

    assert set(optional) == {"evaluation", "start_from", "algorithm.kl", "algorithm.overlong",
                             "algorithm.importance_sampling", "algorithm.value", "algorithm.tool_call_bonus"}
    assert optional["algorithm.tool_call_bonus"].title == "Tool-call bonus"
    evaluation = optional["evaluation"]
    assert evaluation in form.basic.children  # evaluation on/off is a basic choice
    assert evaluation.input_name == "config.evaluation" and evaluation.input_id == "id_config_evaluation"
    assert [field.path for field in optional["algorithm.kl"].fields] == ["algorithm.kl.coef", "algorithm.kl.estimator"]
    assert optional["algorithm.kl"].title == "KL penalty"


def test_labels_read_as_people_write_them():
    fields = _by_path()

    assert fields["rl_learning_rate"].label == "RL learning rate"
    assert fields["rollout.timeout_s"].label == "Rollout timeout (s)"
    assert fields["sampling.max_new_tokens"].label == "Max new tokens"
    assert fields["sft_steps"].label == "SFT steps"
    assert fields["stall_timeout_s"].label == "Stall timeout (s)"
    assert fields["stream.reclaim_idle_ms"].label == "Reclaim idle (ms)"
    assert fields["model.num_kv_heads"].label == "Number of KV heads"
    assert fields["model.rms_norm_eps"].label == "RMS norm epsilon"
    assert fields["sampling.top_p"].label == "Top-p"
    # The generic rule, with no entry of the tables.
    assert config_label("rollout.max_observation_chars") == "Max observation characters"
    assert config_label("schedule.warmup_steps") == "Warmup steps"


def test_fields_take_help_default_and_bounds_from_the_schema():
    fields = _by_path()

    group_size = fields["rollout.group_size"]
    assert (group_size.widget, group_size.integer) == ("number", True)
    assert (group_size.minimum, group_size.maximum, group_size.default) == (2, 256, 8)
    assert group_size.help_text.startswith("Episodes per group")

    epsilon_low = fields["algorithm.epsilon_low"]
    assert (epsilon_low.integer, epsilon_low.exclusive_minimum, epsilon_low.exclusive_maximum) == (False, 0, 1)
    assert epsilon_low.bounds_text == "> 0, < 1"

    name = fields["algorithm.name"]
    assert name.widget == "select" and name.default == "grpo"
    assert name.choices == ("sft", "grpo", "dr_grpo", "dapo", "rloo", "ppo")
    assert fields["model.param_dtype"].choices == ("float32", "bfloat16")
    # A union of a Literal and "auto" is one select too.
    assert fields["model.tool_call_format"].widget == "select"
    assert fields["model.tool_call_format"].choices[-1] == "auto"

    assert fields["lora.enabled"].widget == "checkbox" and fields["lora.enabled"].default is False
    assert fields["model.num_kv_heads"].nullable and fields["model.num_kv_heads"].widget == "number"
    assert fields["model.tokenizer"].widget == "text"


def test_nested_lists_are_rows_or_separated_inputs_and_only_free_form_dicts_stay_json():
    fields = _by_path()

    datasets = fields["sft.datasets"]
    assert datasets.widget == "rows" and datasets.default == []
    assert [(cell.path, cell.widget, cell.required) for cell in datasets.cells] == [
        ("name", "text", True), ("version", "number", False), ("weight", "number", False)]
    assert [cell.path for cell in fields["evaluation.datasets"].cells] == ["name", "version"]
    assert (fields["evaluation.pass_k"].widget, fields["evaluation.pass_k"].item_type) == ("list", "integer")
    assert fields["evaluation.pass_k"].separator == ","
    assert fields["evaluation.environments"].widget == "list"
    assert fields["sampling.stop_strings"].separator == "\n"
    assert fields["lora.targets"].default == ["attention.query", "attention.value"]
    assert fields["lora.targets"].render_value(["a", "b"]) == "a, b"
    json_fields = sorted(field.path for field in config_fields() if field.widget == "json")
    assert json_fields == ["model.chat_template_kwargs", "model.rope_scaling"]
    assert "original_max_position_embeddings" in fields["model.rope_scaling"].format_text


def _submitted(rows: dict | None = None, sections_on=(), **values) -> QueryDict:
    """The form as rendered (every input at its default, checked boxes sent), with ``values`` changed."""
    data = QueryDict(mutable=True)
    state = form_state(config_form())
    for path, text in state.texts.items():
        field = _by_path()[path]
        if field.widget != "checkbox":
            data["config." + path] = text
        elif text == "true":
            data["config." + path] = "true"
    for path in sections_on:
        data["config." + path] = "on"
    for path, items in (rows or {}).items():
        for index, item in enumerate(items):
            for cell, text in item.items():
                data[f"config.{path}.{index}.{cell}"] = text
    for path, value in values.items():
        name = "config." + path.replace("__", ".")
        if value is None:
            data.pop(name, None)
        else:
            data[name] = value
    return data


def test_an_untouched_form_is_an_empty_config():
    submitted = config_from_form(_submitted(), config_form())

    assert submitted.changes == {} and submitted.errors == {}


def test_only_fields_that_differ_from_their_defaults_are_sent_nested():
    submitted = config_from_form(
        _submitted(rl_steps="7", algorithm__epsilon_high="0.28", model__qk_norm="true",
                   sampling__stop_strings="</answer>\nEND, really", model__num_kv_heads="2", learning_rate="0.0030"),
        config_form(),
    )

    assert submitted.errors == {}
    assert submitted.changes == {
        "rl_steps": 7,
        "algorithm": {"epsilon_high": 0.28},
        "model": {"qk_norm": True, "num_kv_heads": 2},
        "sampling": {"stop_strings": ["</answer>", "END, really"]},
    }
    assert RunConfig.model_validate(submitted.changes).rl_steps == 7


def test_rows_lists_and_optional_sections_are_read_as_nested_values():
    submitted = config_from_form(
        _submitted(
            rows={"sft.datasets": [{"name": "chats", "version": "", "weight": "3"}, {"name": "", "version": "",
                                                                                      "weight": ""}],
                  "evaluation.datasets": [{"name": "held", "version": "2"}]},
            sections_on=["evaluation", "algorithm.kl"],
            evaluation__pass_k="1, 2", evaluation__samples_per_task="4", evaluation__environments="calc, echo@2",
            algorithm__kl__coef="0.04",
        ),
        config_form(),
    )

    assert submitted.errors == {}
    # The empty row added and left blank is nothing; a blank nullable cell is null.
    assert submitted.changes["sft"] == {"datasets": [{"name": "chats", "version": None, "weight": 3.0}]}
    assert submitted.changes["evaluation"] == {
        "pass_k": [1, 2], "environments": ["calc", "echo@2"], "datasets": [{"name": "held", "version": 2}]}
    assert submitted.changes["algorithm"] == {"kl": {"coef": 0.04}}
    config = RunConfig.model_validate(submitted.changes)
    assert config.evaluation.pass_k == [1, 2] and config.algorithm.kl.estimator == "k3"


def test_an_optional_section_that_is_off_is_not_sent_whatever_its_fields_hold():
    submitted = config_from_form(_submitted(evaluation__tasks="nonsense", evaluation__pass_k="x"), config_form())

    assert submitted.changes == {} and submitted.errors == {}
    assert submitted.state.sections_on["evaluation"] is False
    assert submitted.state.texts["evaluation.tasks"] == "nonsense"  # shown again as typed


def test_every_input_that_does_not_parse_is_an_error_at_once_and_bad_numbers_go_on_to_the_schema():
    submitted = config_from_form(
        _submitted(sections_on=["evaluation"], model__rope_scaling="{oops", model__chat_template_kwargs="[1,",
                   evaluation__pass_k="1, two", rollout__group_size="many"),
        config_form(),
    )

    assert sorted(submitted.errors) == ["evaluation.pass_k", "model.chat_template_kwargs", "model.rope_scaling"]
    assert submitted.errors["evaluation.pass_k"] == ["two: not a whole number."]
    assert submitted.changes["rollout"] == {"group_size": "many"}  # RunConfig names this one
    assert submitted.state.texts["rollout.group_size"] == "many"


def test_a_value_left_at_the_schema_default_is_sent_when_the_preset_would_change_it():
    # dapo presets epsilon_high=0.28 and overlong shaping; the form shows 0.2 and overlong off.
    submitted = config_from_form(_submitted(algorithm__name="dapo"), config_form())

    assert submitted.changes["algorithm"]["epsilon_high"] == 0.2
    assert submitted.changes["algorithm"]["overlong"] is None
    config = RunConfig.model_validate(submitted.changes)
    assert config.algorithm.epsilon_high == 0.2 and config.algorithm.overlong is None


def test_an_algorithm_preset_as_the_page_fills_it_is_sent_as_what_it_resolves_to():
    dapo = algorithm_presets()["dapo"]
    assert dapo["epsilon_high"] == 0.28 and dapo["dynamic_sampling"] is True
    inputs = preset_inputs(config_form(), {"algorithm": dapo})
    assert inputs["config.algorithm.overlong"] is True and inputs["config.algorithm.kl"] is False
    assert inputs["config.algorithm.overlong.penalty_factor"] == "1.0"
    data = _submitted()
    for name, value in inputs.items():
        if value is True:
            data[name] = "true"
        elif value is False:
            data.pop(name, None)
        else:
            data[name] = value

    submitted = config_from_form(data, config_form())

    assert submitted.changes == {"algorithm": {"name": "dapo", "epsilon_high": 0.28, "overlong": {},
                                               "dynamic_sampling": True}}
    assert RunConfig.model_validate(submitted.changes).algorithm.model_dump(mode="json") == dapo


def test_the_presets_are_each_algorithm_and_fast_demo_and_real_model_only_where_it_is_installed(tmp_path):
    form = config_form()
    without = {preset.key: preset for preset in form_presets(form, model_roots=[tmp_path])}
    model = tmp_path / "smollm2-135m-instruct"
    model.mkdir()
    (model / "config.json").write_text("{}")
    with_model = {preset.key: preset for preset in form_presets(form, model_roots=[tmp_path / "none", tmp_path])}

    assert list(without) == ["algorithm-sft", "algorithm-grpo", "algorithm-dr_grpo", "algorithm-dapo",
                             "algorithm-rloo", "algorithm-ppo", "fast-demo"]
    fast = without["fast-demo"].inputs
    assert fast["config.rl_steps"] == str(SHORT_RUN_CONFIG["rl_steps"])
    assert fast["config.rollout.group_size"] == "4" and "config.model.hf_checkpoint" not in fast
    real = with_model["real-model"]
    assert real.label == "Real model (SmolLM2-135M-Instruct)"
    assert real.inputs["config.model.hf_checkpoint"] == str(model.resolve())
    assert real.inputs["config.model.tokenizer"] == str(model.resolve())
    assert real.inputs["config.rl_learning_rate"] == "1e-05"


def test_the_review_lists_only_what_differs_from_the_defaults():
    config = RunConfig.model_validate({
        "rl_steps": 7, "algorithm": {"name": "dapo"}, "evaluation": {"tasks": 8},
    }).model_dump(mode="json")

    lines = {line["path"]: line for line in config_review(config_form(), config)}

    assert set(lines) == {"rl_steps", "algorithm.name", "algorithm.epsilon_high", "algorithm.overlong",
                          "algorithm.dynamic_sampling", "evaluation", "evaluation.tasks"}
    assert lines["rl_steps"] == {"path": "rl_steps", "label": "RL steps", "default": "40", "value": "7"}
    assert (lines["evaluation"]["default"], lines["evaluation"]["value"]) == ("off", "on")
    assert (lines["evaluation.tasks"]["default"], lines["evaluation.tasks"]["value"]) == ("32", "8")
    assert config_review(config_form(), RunConfig().model_dump(mode="json")) == []


def test_a_stored_config_shows_as_the_inputs_that_hold_it():
    state = form_state(config_form(), {
        "rl_steps": 9, "sft": {"datasets": [{"name": "chats", "version": 2, "weight": 1.0}]},
        "evaluation": {"pass_k": [1, 4], "samples_per_task": 4}, "sampling": {"stop_strings": ["A", "B"]},
    })

    assert state.texts["rl_steps"] == "9"
    assert state.rows["sft.datasets"] == [{"name": "chats", "version": "2", "weight": "1.0"}]
    assert state.sections_on == {"evaluation": True, "start_from": False, "algorithm.kl": False,
                                 "algorithm.overlong": False, "algorithm.importance_sampling": False,
                                 "algorithm.value": False, "algorithm.tool_call_bonus": False}
    assert state.texts["evaluation.pass_k"] == "1, 4"
    assert state.texts["sampling.stop_strings"] == "A\nB"
