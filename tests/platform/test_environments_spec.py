"""EnvironmentSpec, the contract a registered version travels in (schema 3, reads schemas 1 and 2)."""

import json

import pydantic
import pytest

from environment_registry.builtin import CALCULATOR
from tandem.contracts import (
    ADAPTER_ENTRYPOINTS,
    ENVIRONMENT_KINDS,
    EnvironmentSpec,
    ProbeRequest,
    RunSpec,
    environment_kind_choices,
)


def test_a_schema_1_spec_reads_as_version_0_of_kind_python():
    old = {"schema_version": 1, "name": "calculator", "kind": "python",
           "entrypoint": "environments.builtin.calculator:CalculatorEnvironment", "params": {"a": 1}}

    spec = EnvironmentSpec.model_validate(old)

    assert spec.schema_version == 6 and spec.version == 0 and spec.version_id is None
    assert spec.settings == {"a": 1} and spec.tools == ()
    assert spec.label == "calculator"


# What a trainer or platform from before schema 3 wrote: the settings under their old name.
SCHEMA_2_SPEC = {"schema_version": 2, "name": "echo", "version": 3, "version_id": 9, "kind": "http",
                 "entrypoint": "", "params": {"url": "http://host:8765"}, "tools": []}


def test_a_schema_2_spec_reads_its_params_as_settings():
    spec = EnvironmentSpec.model_validate(SCHEMA_2_SPEC)

    assert spec.schema_version == 6 and spec.settings == {"url": "http://host:8765"}
    assert "params" not in spec.model_dump() and spec.model_dump()["settings"] == spec.settings


def test_a_run_spec_in_redis_written_with_params_still_reads():
    stored = json.dumps({"schema_version": 1, "run_id": 7, "config": {}, "environment": SCHEMA_2_SPEC})

    spec = RunSpec.model_validate_json(stored)

    assert spec.environment.settings == {"url": "http://host:8765"} and spec.environment.label == "echo@3"


def test_a_probe_request_written_with_params_still_reads():
    stored = json.dumps({"schema_version": 1, "probe_id": 5, "purpose": "registration",
                         "environment": SCHEMA_2_SPEC})

    assert ProbeRequest.model_validate_json(stored).environment.settings == {"url": "http://host:8765"}


@pytest.mark.parametrize(("kind", "old", "new"), [
    ("python", "workers.environments.calculator:CalculatorEnvironment",
     "environments.builtin.calculator:CalculatorEnvironment"),
    ("http", "workers.environments.http:RemoteHTTPEnvironment", ADAPTER_ENTRYPOINTS["http"]),
    ("reasoning_gym", "workers.environments.reasoning_gym:ReasoningGymEnvironment",
     ADAPTER_ENTRYPOINTS["reasoning_gym"]),
    ("python", "teams.own.module:Env", "teams.own.module:Env"),
])
def test_a_spec_from_before_the_move_names_the_new_home_of_its_module(kind, old, new):
    # A RunSpec or ProbeRequest an older process left in Redis still names workers.environments.
    spec = EnvironmentSpec.model_validate({"schema_version": 2, "name": "e", "kind": kind,
                                           "entrypoint": old, "params": {"dataset": "x", "url": "http://h"}})

    assert spec.entrypoint == new


def test_a_current_spec_keeps_its_entrypoint_as_written():
    with pytest.raises(pydantic.ValidationError, match="always loads"):
        EnvironmentSpec.model_validate({"name": "e", "kind": "http", "settings": {"url": "http://h"},
                                        "entrypoint": "workers.environments.http:RemoteHTTPEnvironment"})


def test_a_schema_3_spec_reads_with_no_tool_server():
    schema_3 = {key: value for key, value in SCHEMA_2_SPEC.items() if key != "params"}
    spec = EnvironmentSpec.model_validate({**schema_3, "schema_version": 3, "settings": {"url": "http://h:1"}})

    assert spec.schema_version == 6 and spec.tool_server is None


def test_a_newer_schema_is_refused():
    with pytest.raises(pydantic.ValidationError, match="schema_version 7 is not supported"):
        EnvironmentSpec.model_validate({"schema_version": 7, "name": "x", "kind": "python",
                                        "entrypoint": "a:B"})


def test_every_kind_but_python_is_an_adapter_and_the_choices_list_every_kind():
    assert set(ADAPTER_ENTRYPOINTS) == set(ENVIRONMENT_KINDS) - {"python"}
    assert [kind for kind, _label in environment_kind_choices()] == list(ENVIRONMENT_KINDS)


@pytest.mark.parametrize("kind", sorted(ADAPTER_ENTRYPOINTS))
def test_adapter_kinds_load_their_adapter(kind):
    spec = EnvironmentSpec(name="x", kind=kind, settings={})

    assert spec.entrypoint == ADAPTER_ENTRYPOINTS[kind]
    with pytest.raises(pydantic.ValidationError, match=f"kind '{kind}' always loads"):
        EnvironmentSpec(name="x", kind=kind, entrypoint="my.module:Other")


def test_kind_python_needs_an_entrypoint():
    with pytest.raises(pydantic.ValidationError, match="needs an entrypoint"):
        EnvironmentSpec(name="x", kind="python")


def test_a_pinned_version_round_trips_through_a_run_spec():
    pinned = CALCULATOR.model_copy(update={"version": 4, "version_id": 17})

    read = RunSpec.model_validate_json(RunSpec(run_id=1, config={}, environment=pinned).model_dump_json())

    assert read.environment == pinned and read.environment.label == "calculator@4"
    assert read.environment.tools[0].parameters["required"] == ["expression"]


def test_a_tool_server_is_a_command_or_a_url_never_both_or_neither():
    from tandem.contracts import ToolServerSpec

    assert ToolServerSpec(command="arithmetic").label == "arithmetic"
    assert ToolServerSpec(url="http://tools:8000/mcp").label == "http://tools:8000/mcp"
    for fields in ({}, {"command": "arithmetic", "url": "http://tools:8000/mcp"}):
        with pytest.raises(pydantic.ValidationError, match="exactly one of `command`"):
            ToolServerSpec(**fields)
    # A schema 4 record's tool server is a command.
    schema_4 = {"schema_version": 4, "name": "e", "kind": "python", "entrypoint": "a:B",
                "tool_server": {"command": "arithmetic"}}
    assert EnvironmentSpec.model_validate(schema_4).tool_server == ToolServerSpec(command="arithmetic")
