"""No test waits longer than its own pytest timeout: a named wait, not the timeout, says what failed.

Each test's inner waits (poll_until, run_ended, dataset_stored, a subprocess's timeout, a
browser's wait_for_*) are added up from their timeouts, as if every one ran to its end: literal
numbers, the module's constants and sums or products of them, and the waits of the module's own
helper functions that the test calls (followed two calls deep). The test's timeout (its
``pytest.mark.timeout``, or the global one in pyproject.toml) must be longer than that sum.
"""

from __future__ import annotations

import ast
import operator
import tomllib
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent
GLOBAL_TIMEOUT_S = tomllib.loads((TESTS_DIR.parent / "pyproject.toml").read_text())["tool"]["pytest"][
    "ini_options"]["timeout"]
#: Calls that wait as long as their ``timeout_s``/``timeout`` keyword (seconds).
WAITS = {"poll_until", "run_ended", "dataset_stored", "communicate", "run", "check_output"}
#: A wait's default when the call names none (tests/e2e/conftest.py).
DEFAULT_WAIT_S = {"dataset_stored": 300}


def _name(call: ast.Call) -> str:
    return call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")


ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _number(node: ast.expr, constants: dict[str, float]) -> float | None:
    """A literal number, a module constant, or arithmetic of them; None for anything else."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.Name):
        return constants.get(node.id)
    if isinstance(node, ast.BinOp) and type(node.op) in ARITHMETIC:
        left, right = _number(node.left, constants), _number(node.right, constants)
        if left is not None and right is not None:
            return ARITHMETIC[type(node.op)](left, right)
    return None


def _module_constants(module: ast.Module) -> dict[str, float]:
    constants: dict[str, float] = {}
    for statement in module.body:
        targets = statement.targets if isinstance(statement, ast.Assign) else \
            [statement.target] if isinstance(statement, ast.AnnAssign) and statement.value else []
        for target in targets:
            if isinstance(target, ast.Name):
                value = _number(statement.value, constants)
                if value is not None:
                    constants[target.id] = value
            elif isinstance(target, ast.Tuple) and isinstance(statement.value, ast.Tuple):
                for name, element in zip(target.elts, statement.value.elts, strict=False):
                    value = _number(element, constants)
                    if isinstance(name, ast.Name) and value is not None:
                        constants[name.id] = value
    return constants


def _waited_s(call: ast.Call, constants: dict[str, float] | None = None) -> float:
    name = _name(call)
    if name not in WAITS and "wait" not in name:
        return 0.0
    for keyword in call.keywords:
        if keyword.arg in ("timeout_s", "timeout"):
            seconds = _number(keyword.value, constants or {})
            if seconds is not None:
                # Playwright's page.wait_for_*(timeout=...) counts milliseconds.
                return seconds / 1000 if name.startswith("wait_for_") else seconds
    return float(DEFAULT_WAIT_S.get(name, 0))


def _own_timeout_s(test: ast.FunctionDef | ast.AsyncFunctionDef) -> float | None:
    for decorator in test.decorator_list:
        if isinstance(decorator, ast.Call) and _name(decorator) == "timeout" and decorator.args:
            return float(ast.literal_eval(decorator.args[0]))
    return None


def _waits_s(function: ast.FunctionDef | ast.AsyncFunctionDef, helpers: dict, constants: dict[str, float],
             depth: int = 2) -> float:
    """The waits of ``function``'s calls, and of the module's helpers it calls, ``depth`` calls deep."""
    total = 0.0
    for call in ast.walk(function):
        if not isinstance(call, ast.Call):
            continue
        total += _waited_s(call, constants)
        helper = helpers.get(getattr(call.func, "id", None))
        if helper is not None and helper is not function and depth > 0:
            total += _waits_s(helper, helpers, constants, depth - 1)
    return total


def _tests_waiting_past_their_timeout() -> list[str]:
    found = []
    for path in sorted(TESTS_DIR.rglob("test_*.py")):
        module = ast.parse(path.read_text())
        constants = _module_constants(module)
        helpers = {node.name: node for node in module.body
                   if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("test_")}
        for node in ast.walk(module):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or not node.name.startswith("test_"):
                continue
            waits = _waits_s(node, helpers, constants)
            timeout = _own_timeout_s(node) or GLOBAL_TIMEOUT_S
            if waits >= timeout:
                found.append(f"{path.relative_to(TESTS_DIR.parent)}:{node.lineno} {node.name}: waits up to "
                             f"{waits:.0f} s, times out at {timeout:.0f} s")
    return found


def test_every_tests_inner_waits_end_before_its_timeout():
    assert _tests_waiting_past_their_timeout() == []


def test_the_check_counts_a_wait_past_the_global_timeout():
    long_wait = ast.parse(f"poll_until(ready, timeout_s={GLOBAL_TIMEOUT_S}, what='x')").body[0].value
    assert _waited_s(long_wait) == GLOBAL_TIMEOUT_S
    browser_wait = ast.parse("page.wait_for_selector('#x', timeout=300_000)").body[0].value
    assert _waited_s(browser_wait) == 300


def test_the_check_reads_module_constants_and_follows_the_modules_helpers():
    """Before, a wait named by a constant or made inside a helper counted 0 s (test_shared_trainer waited
    up to 1,140 s under a 900 s timeout)."""
    module = ast.parse(
        "SET_ASIDE_S, RESTARTS = 60, 2\n"
        "def _upload():\n    poll_until(ready, timeout_s=120)\n"
        "def test_x():\n    _upload()\n    run_ended(api, 1, timeout_s=RESTARTS * SET_ASIDE_S + 300)\n")
    constants = _module_constants(module)
    helpers = {node.name: node for node in module.body if isinstance(node, ast.FunctionDef)}
    assert _waits_s(helpers["test_x"], helpers, constants) == 120 + 2 * 60 + 300
