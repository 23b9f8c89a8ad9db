"""No test waits longer than its own pytest timeout: a named wait, not the timeout, says what failed.

Each test's inner waits (poll_until, run_ended, dataset_stored, a subprocess's timeout, a
browser's wait_for_*) are added up from their literal timeouts, as if every one ran to its end;
the test's timeout (its ``pytest.mark.timeout``, or the global one in pyproject.toml) must be
longer than that sum.
"""

from __future__ import annotations

import ast
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


def _waited_s(call: ast.Call) -> float:
    name = _name(call)
    if name not in WAITS and "wait" not in name:
        return 0.0
    for keyword in call.keywords:
        if keyword.arg in ("timeout_s", "timeout") and isinstance(keyword.value, ast.Constant) \
                and isinstance(keyword.value.value, int | float):
            # Playwright's page.wait_for_*(timeout=...) counts milliseconds.
            return keyword.value.value / 1000 if name.startswith("wait_for_") else float(keyword.value.value)
    return float(DEFAULT_WAIT_S.get(name, 0))


def _own_timeout_s(test: ast.FunctionDef | ast.AsyncFunctionDef) -> float | None:
    for decorator in test.decorator_list:
        if isinstance(decorator, ast.Call) and _name(decorator) == "timeout" and decorator.args:
            return float(ast.literal_eval(decorator.args[0]))
    return None


def _tests_waiting_past_their_timeout() -> list[str]:
    found = []
    for path in sorted(TESTS_DIR.rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or not node.name.startswith("test_"):
                continue
            waits = sum(_waited_s(call) for call in ast.walk(node) if isinstance(call, ast.Call))
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
