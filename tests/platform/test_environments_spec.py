"""EnvironmentSpec, the contract a registered version travels in (schema 2, reads schema 1)."""

import pydantic
import pytest

from environment_registry.builtin import CALCULATOR
from tandem.contracts import ADAPTER_ENTRYPOINTS, EnvironmentSpec, RunSpec


def test_a_schema_1_spec_reads_as_version_0_of_kind_python():
    old = {"schema_version": 1, "name": "calculator", "kind": "python",
           "entrypoint": "environments.builtin.calculator:CalculatorEnvironment", "params": {"a": 1}}

    spec = EnvironmentSpec.model_validate(old)

    assert spec.schema_version == 2 and spec.version == 0 and spec.version_id is None
    assert spec.params == {"a": 1} and spec.tools == ()
    assert spec.label == "calculator"


def test_a_newer_schema_is_refused():
    with pytest.raises(pydantic.ValidationError, match="schema_version 3 is not supported"):
        EnvironmentSpec.model_validate({"schema_version": 3, "name": "x", "kind": "python",
                                        "entrypoint": "a:B"})


@pytest.mark.parametrize("kind", sorted(ADAPTER_ENTRYPOINTS))
def test_adapter_kinds_load_their_adapter(kind):
    spec = EnvironmentSpec(name="x", kind=kind, params={})

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
