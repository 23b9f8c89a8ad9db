"""The new-run form's fields, generated from RunConfig's JSON schema."""

from __future__ import annotations

import json

from django.http import QueryDict

from runs.config_form import algorithm_presets, config_fields, config_from_form, config_sections
from tandem.run_config import RunConfig


def _leaf_paths(model_schema: dict, root: dict, prefix: str = "") -> set[str]:
    """Every leaf field of the schema, walked independently of the builder: required nested
    models are sections, everything else (optional sections included) is one input."""
    paths = set()
    for name, prop in model_schema["properties"].items():
        ref = prop.get("$ref")
        if ref:
            target = root["$defs"][ref.rsplit("/", 1)[1]]
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
    assert {"seed", "model.d_model", "algorithm.epsilon_high", "lora.rank", "mesh.data"} <= set(paths)


def test_nested_models_are_sections_titled_and_described():
    sections = {section.path: section for section in config_sections()}

    assert list(sections) == ["", "lora", "mesh", "algorithm", "model", "optimizer", "schedule", "sft",
                              "sampling", "rollout", "stream", "checkpoint", "weights"]
    assert sections["rollout"].title == "Rollout"
    assert sections["algorithm"].title == "Algorithm"
    assert sections["lora"].title == "LoRA"
    assert sections["model"].description == "Policy architecture."
    assert all(field.path.startswith("model.") for field in sections["model"].fields)


def test_fields_take_label_help_default_and_bounds_from_the_schema():
    fields = _by_path()

    group_size = fields["rollout.group_size"]
    assert (group_size.widget, group_size.integer) == ("number", True)
    assert (group_size.minimum, group_size.maximum, group_size.default) == (2, 256, 8)
    assert group_size.label == "Group Size"
    assert group_size.help_text.startswith("Episodes per group")

    epsilon_low = fields["algorithm.epsilon_low"]
    assert (epsilon_low.integer, epsilon_low.exclusive_minimum, epsilon_low.exclusive_maximum) == (False, 0, 1)
    assert epsilon_low.bounds_text == "> 0, < 1"

    name = fields["algorithm.name"]
    assert name.widget == "select"
    assert name.choices == ("sft", "grpo", "dr_grpo", "dapo", "rloo", "ppo")
    assert name.default == "grpo"
    assert fields["model.param_dtype"].choices == ("float32", "bfloat16")

    assert fields["lora.enabled"].widget == "checkbox" and fields["lora.enabled"].default is False
    assert fields["model.num_kv_heads"].nullable and fields["model.num_kv_heads"].widget == "number"
    assert fields["model.tokenizer"].widget == "text"
    # Lists, dicts and optional sections are edited as JSON; a default_factory's value is known.
    assert fields["sampling.stop_strings"].widget == "json" and fields["sampling.stop_strings"].default == []
    assert fields["lora.targets"].default == ["attention.query", "attention.value"]
    assert fields["algorithm.kl"].widget == "json" and fields["algorithm.kl"].nullable
    assert fields["model.rope_scaling"].widget == "json"


def _submitted(**values) -> QueryDict:
    data = QueryDict(mutable=True)
    fields = config_fields()
    # The form as rendered: every input at its default, checked boxes sent.
    for field in fields:
        if field.widget == "checkbox":
            if field.default:
                data[field.input_name] = "true"
        else:
            data[field.input_name] = field.render_value(field.default)
    for path, value in values.items():
        name = "config." + path.replace("__", ".")
        if value is None:
            data.pop(name, None)
        else:
            data[name] = value
    return data


def test_an_untouched_form_is_an_empty_config():
    submitted = config_from_form(_submitted(), config_fields())

    assert submitted.changes == {} and submitted.errors == {}


def test_only_fields_that_differ_from_their_defaults_are_sent_nested():
    submitted = config_from_form(
        _submitted(rl_steps="7", algorithm__epsilon_high="0.28", model__qk_norm="true",
                   sampling__stop_strings='["</answer>"]', model__num_kv_heads="2", learning_rate="0.0030"),
        config_fields(),
    )

    assert submitted.errors == {}
    assert submitted.changes == {
        "rl_steps": 7,
        "algorithm": {"epsilon_high": 0.28},
        "model": {"qk_norm": True, "num_kv_heads": 2},
        "sampling": {"stop_strings": ["</answer>"]},
    }
    assert RunConfig.model_validate(submitted.changes).rl_steps == 7


def test_bad_json_is_an_error_of_its_field_and_bad_numbers_go_on_to_the_schema():
    submitted = config_from_form(_submitted(sampling__stop_strings="[oops", rollout__group_size="many"),
                                 config_fields())

    assert list(submitted.errors) == ["sampling.stop_strings"]
    assert submitted.changes == {"rollout": {"group_size": "many"}}  # RunConfig names this one
    assert submitted.raw["rollout.group_size"] == "many"


def test_a_value_left_at_the_schema_default_is_sent_when_the_preset_would_change_it():
    # dapo presets epsilon_high=0.28; the form shows 0.2, so 0.2 is what was asked for.
    submitted = config_from_form(_submitted(algorithm__name="dapo"), config_fields())

    assert submitted.changes["algorithm"]["epsilon_high"] == 0.2
    assert submitted.changes["algorithm"]["overlong"] is None
    assert RunConfig.model_validate(submitted.changes).algorithm.epsilon_high == 0.2


def test_a_preset_as_the_page_shows_it_is_sent_as_just_the_algorithms_name():
    dapo = algorithm_presets()["dapo"]
    assert dapo["epsilon_high"] == 0.28 and dapo["dynamic_sampling"] is True
    shown = {
        f"algorithm__{name}": json.dumps(value) if isinstance(value, dict) else
        ("true" if value is True else None if value is False else "" if value is None else str(value))
        for name, value in dapo.items()
    }

    submitted = config_from_form(_submitted(**shown), config_fields())

    assert submitted.changes == {"algorithm": {"name": "dapo", "epsilon_high": 0.28, "overlong": dapo["overlong"],
                                               "dynamic_sampling": True}}
    assert RunConfig.model_validate(submitted.changes).algorithm.model_dump(mode="json") == dapo
