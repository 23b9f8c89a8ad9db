"""RunConfig's sections, its schema version, and the upgrade of configs stored in the flat version 1."""

from __future__ import annotations

import copy

import pytest
from pydantic import ValidationError

from tandem.configs.run import RUN_CONFIG_SCHEMA_VERSION, RunConfig, upgrade_run_config
from tandem.contracts import EnvironmentSpec, RunSpec

# A version-1 config as the platform stored it (flat, no schema_version), every
# moved key away from its default so that a key dropped or misplaced shows.
VERSION_1 = {
    "seed": 5, "sft_steps": 10, "rl_steps": 7, "model": {"d_model": 32, "num_heads": 2},
    "temperature": 0.7, "top_p": 0.9, "top_k": 40, "stop_strings": ["</answer>"], "max_new_tokens": 16,
    "inference_slots": 12, "decode_chunk_tokens": 4,
    "groups_per_step": 3, "group_size": 4, "groups_per_task": 1, "pipeline": "sync",
    "rollout_backlog_steps": 5, "max_staleness": 1, "rollout_timeout_s": 60.0, "max_turns": 2,
    "environment_timeout_s": 5.0, "max_observation_chars": 1000,
    "reclaim_idle_ms": 2000, "max_deliveries": 3,
    "checkpoint_every": 4, "checkpoints_kept": 2,
    "weight_transport": "filesystem", "weight_dir": "/shared/weights",
}
VERSION_2 = {
    "schema_version": 2, "seed": 5, "sft_steps": 10, "rl_steps": 7, "model": {"d_model": 32, "num_heads": 2},
    "sampling": {"temperature": 0.7, "top_p": 0.9, "top_k": 40, "stop_strings": ["</answer>"],
                 "max_new_tokens": 16, "inference_slots": 12, "decode_chunk_tokens": 4},
    "rollout": {"groups_per_step": 3, "group_size": 4, "groups_per_task": 1, "pipeline": "sync",
                "backlog_steps": 5, "max_staleness": 1, "timeout_s": 60.0, "max_turns": 2,
                "environment_timeout_s": 5.0, "max_observation_chars": 1000},
    "stream": {"reclaim_idle_ms": 2000, "max_deliveries": 3},
    "checkpoint": {"every": 4, "kept": 2},
    "weights": {"transport": "filesystem", "dir": "/shared/weights"},
}


def test_a_config_says_its_schema_version():
    assert RunConfig().schema_version == RUN_CONFIG_SCHEMA_VERSION == 2
    assert RunConfig().model_dump(mode="json")["schema_version"] == 2


def test_every_version_1_key_moves_to_its_section_under_its_new_name():
    assert upgrade_run_config(VERSION_1) == VERSION_2
    assert RunConfig.model_validate(upgrade_run_config(VERSION_1)) == RunConfig.model_validate(VERSION_2)


def test_the_upgrade_leaves_its_input_as_it_was():
    given = copy.deepcopy(VERSION_1) | {"rollout": {"max_turns": 2}}
    before = copy.deepcopy(given)

    upgrade_run_config(given)

    assert given == before


def test_an_explicit_version_1_is_upgraded_too():
    assert upgrade_run_config({"schema_version": 1, "group_size": 4}) == {
        "schema_version": 2, "rollout": {"group_size": 4},
    }


def test_a_current_config_is_unchanged():
    current = RunConfig().model_dump(mode="json")

    assert upgrade_run_config(current) == current


def test_a_partial_config_of_the_current_shape_without_a_version_is_unchanged():
    partial = {"rl_steps": 3, "rollout": {"group_size": 4}, "sampling": {"top_p": 0.9}}

    assert upgrade_run_config(partial) == {**partial, "schema_version": 2}


def test_old_keys_merge_into_a_section_already_given():
    upgraded = upgrade_run_config({"rollout": {"max_turns": 2}, "group_size": 4, "temperature": 0.5})

    assert upgraded == {"schema_version": 2, "rollout": {"max_turns": 2, "group_size": 4},
                        "sampling": {"temperature": 0.5}}


def test_an_old_key_whose_new_place_is_taken_stays_for_validation_to_name():
    upgraded = upgrade_run_config({"rollout": {"group_size": 4}, "group_size": 6})

    assert upgraded == {"schema_version": 2, "rollout": {"group_size": 4}, "group_size": 6}
    with pytest.raises(ValidationError) as error:
        RunConfig.model_validate(upgraded)
    assert [e["loc"] for e in error.value.errors()] == [("group_size",)]


def test_unknown_keys_stay_for_validation_to_name():
    upgraded = upgrade_run_config({"group_size": 4, "no_such_setting": 1})

    assert upgraded["no_such_setting"] == 1
    with pytest.raises(ValidationError) as error:
        RunConfig.model_validate(upgraded)
    assert [e["loc"] for e in error.value.errors()] == [("no_such_setting",)]


def test_a_version_this_reader_does_not_know_is_refused_not_misread():
    newer = {"schema_version": 3, "rollout": {"group_size": 4}}

    assert upgrade_run_config(newer) == newer
    with pytest.raises(ValidationError) as error:
        RunConfig.model_validate(newer)
    assert [e["loc"] for e in error.value.errors()] == [("schema_version",)]


def test_the_flat_shape_is_refused_without_the_upgrade():
    with pytest.raises(ValidationError) as error:
        RunConfig.model_validate({"schema_version": 2, "group_size": 4})
    assert [e["loc"] for e in error.value.errors()] == [("group_size",)]


def test_sections_refuse_fields_they_do_not_have():
    with pytest.raises(ValidationError) as error:
        RunConfig.model_validate({"rollout": {"temperature": 0.5}})
    assert [e["loc"] for e in error.value.errors()] == [("rollout", "temperature")]


def test_a_task_larger_than_the_staleness_budget_is_refused_naming_the_rollout_fields():
    with pytest.raises(ValidationError) as error:
        RunConfig.model_validate({"rollout": {"groups_per_step": 2, "groups_per_task": 4, "max_staleness": 0}})

    (only,) = error.value.errors()
    assert only["loc"] == ("rollout",)
    assert "rollout.groups_per_task must be at most (rollout.max_staleness + 1) * rollout.groups_per_step" in only["msg"]
    RunConfig.model_validate({"rollout": {"groups_per_step": 2, "groups_per_task": 4, "max_staleness": None}})


def test_episodes_per_step_is_groups_times_their_size():
    assert RunConfig.model_validate({"rollout": {"groups_per_step": 3, "group_size": 4}}).rollout.episodes_per_step == 12


def test_every_section_field_is_described():
    for section in ("sampling", "rollout", "stream", "checkpoint", "weights"):
        assert RunConfig.model_fields[section].description
        for name, field in type(getattr(RunConfig(), section)).model_fields.items():
            assert field.description, f"{section}.{name}"


def test_a_run_spec_carries_the_config_typed_and_reads_one_an_older_trainer_wrote():
    environment = EnvironmentSpec(name="calculator", kind="python",
                                  entrypoint="environments.builtin.calculator:CalculatorEnvironment")
    config = RunConfig.model_validate(VERSION_2)
    spec = RunSpec(run_id=1, config=config, environment=environment)

    read = RunSpec.model_validate_json(spec.model_dump_json())
    assert isinstance(read.config, RunConfig) and read.config == config

    # A spec in Redis written before sections holds the flat config.
    older = {"schema_version": 1, "run_id": 1, "config": VERSION_1,
             "environment": environment.model_dump(mode="json")}
    assert read.schema_version == 2
    assert RunSpec.model_validate(older).config == config
    assert RunSpec.model_validate(older).schema_version == 2
