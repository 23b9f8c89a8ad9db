"""The one walk of a JSON value (tandem/contracts/json_values.py) that the API parsers and dataset rows share."""

import pytest

from tandem.contracts.json_values import JsonValueProblem, json_value_problem


def test_the_first_problem_in_document_order_is_named_by_its_path():
    value = {"a": [1, "ok", {"b": "x\x00"}], "c": float("nan")}
    assert json_value_problem(value, max_depth=8) == JsonValueProblem(path=("a", "2", "b"), kind="nul", found="\x00")


def test_a_key_is_checked_before_what_its_object_holds():
    value = {"fine": "\ud800", "bad\udce9": 1}
    problem = json_value_problem(value, max_depth=8)
    assert problem == JsonValueProblem(path=("bad\udce9",), kind="surrogate", in_key=True, found="\udce9")


def test_a_container_at_max_depth_is_refused_at_its_own_path_without_recursion():
    deep: list = []
    for _ in range(5000):  # deeper than Python's recursion limit
        deep = [deep]
    problem = json_value_problem({"x": deep}, max_depth=3)
    assert (problem.path, problem.kind) == (("x", "0", "0"), "depth")
    assert json_value_problem({"x": [[1]]}, max_depth=3) is None


@pytest.mark.parametrize(("value", "allowed"), [
    ("a\x00b", {"allow_nul": True}),
    ("a\ud800b", {"allow_surrogates": True}),
    (float("inf"), {"allow_non_finite": True}),
])
def test_what_is_allowed_passes_and_is_refused_otherwise(value, allowed):
    assert json_value_problem([value], max_depth=4, **allowed) is None
    assert json_value_problem([value], max_depth=4).path == ("0",)
