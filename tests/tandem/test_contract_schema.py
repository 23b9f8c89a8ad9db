"""Every versioned record refuses a schema it does not know, and any other schema_version is a field error."""

from __future__ import annotations

import pydantic
import pytest

from tandem.contracts import SCHEMA_VERSION, EvaluationReport, TrainerHeartbeat


@pytest.mark.parametrize("record", [EvaluationReport, TrainerHeartbeat])
@pytest.mark.parametrize("version", [{"nested": True}, [1], [[]]])
def test_a_schema_version_that_is_not_a_number_is_an_error_of_that_field(record, version):
    """Not a TypeError from deep inside (a dict is not hashable): the platform answered 500 to it."""
    with pytest.raises(pydantic.ValidationError) as refused:
        record.model_validate({"schema_version": version})
    assert ("schema_version",) in [error["loc"] for error in refused.value.errors()]


@pytest.mark.parametrize("version", [SCHEMA_VERSION + 1, "1", 0])
def test_a_schema_version_this_reader_does_not_know_is_refused_as_such(version):
    with pytest.raises(pydantic.ValidationError, match="is not supported"):
        TrainerHeartbeat.model_validate({"schema_version": version, "worker": "w"})
