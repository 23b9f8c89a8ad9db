"""The conformance probe, run in this process against good, broken and hanging environments."""

from __future__ import annotations

import time

import pytest

from environment_registry.builtin import CALCULATOR
from environments import http_example_server
from tandem.contracts import EnvironmentSpec, ProbeRequest, ProbeTimeouts
from workers.probe import run_probe

FAST = ProbeTimeouts(url=5, load=10, reset=1.5, tools=1.5, step=1.5, close=1.5)
CHECKS = ["url", "load", "sample_task", "reset", "tools", "step", "budget", "demonstrations", "close"]


def _probe(spec: EnvironmentSpec, **request):
    return run_probe(ProbeRequest(probe_id=1, purpose="registration", environment=spec,
                                  timeouts=request.pop("timeouts", FAST), **request))


def _statuses(report) -> dict[str, str]:
    return {check.name: check.status for check in report.checks}


def _check(report, name):
    return next(check for check in report.checks if check.name == name)


def _python(entrypoint: str, **settings) -> EnvironmentSpec:
    return EnvironmentSpec(name="probe-test", kind="python", entrypoint=entrypoint, settings=settings)


@pytest.fixture(scope="module")
def example_server():
    with http_example_server.running() as url:
        yield url


def test_the_builtin_calculator_passes_every_check_quickly():
    started = time.perf_counter()
    report = _probe(CALCULATOR)

    assert [check.name for check in report.checks] == CHECKS
    assert report.passed, report.checks
    assert _check(report, "tools").message == "1 tool: calc"
    assert _check(report, "step").message == "reward 0, done True"
    assert all(check.latency_s is not None and check.latency_s < 1.0 for check in report.checks)
    assert _check(report, "reset").timeout_s == FAST.reset
    assert all(check.timeout_s is not None for check in report.checks)  # every check has a limit
    assert time.perf_counter() - started < 2.0


def test_a_reset_and_turn_past_the_default_budget_pass_with_a_warning_that_names_the_numbers():
    from tandem.configs.run import RunConfig

    defaults = RunConfig()
    report = _probe(_python("tests.workers.probe_environments:VerboseEnvironment",
                            chars=defaults.model.max_seq_len))
    assert _statuses(report)["budget"] == "warning"
    assert report.passed  # the environment works: a warning does not fail its registration
    message = _check(report, "budget").message
    assert f"model.max_seq_len={defaults.model.max_seq_len}" in message
    assert f"sampling.max_new_tokens={defaults.sampling.max_new_tokens}" in message
    assert "set model.max_seq_len to" in message

    fits = _probe(CALCULATOR)
    assert _statuses(fits)["budget"] == "passed"
    assert f"of the default {defaults.model.max_seq_len} tokens" in _check(fits, "budget").message


def test_the_http_example_server_passes(example_server):
    spec = EnvironmentSpec(name="remote", kind="http", settings={"url": example_server},
                           tools=CALCULATOR.tools)

    report = _probe(spec)

    assert report.passed, report.checks
    assert _check(report, "url").message == f"{example_server} is allowed"


def test_a_step_that_crashes_fails_the_step_and_still_closes():
    report = _probe(_python("tests.workers.probe_environments:BrokenStepEnvironment"))

    assert not report.passed
    assert _statuses(report) == {"url": "passed", "load": "passed", "sample_task": "passed",
                                 "reset": "passed", "tools": "passed", "step": "failed",
                                 "budget": "skipped", "demonstrations": "skipped", "close": "passed"}
    assert _check(report, "step").message.startswith("ValueError: invalid literal for int()")


def test_a_reward_of_the_wrong_type_fails_the_step():
    report = _probe(_python("tests.workers.probe_environments:WrongRewardEnvironment"))

    assert _check(report, "step").status == "failed"
    assert _check(report, "step").message == "step reward is '1.0', expected a finite number"


def test_a_hanging_http_reset_times_out_and_skips_the_rest(example_server):
    spec = EnvironmentSpec(name="hang", kind="http", settings={"url": f"{example_server}/faults/hang"},
                           tools=CALCULATOR.tools)

    started = time.perf_counter()
    report = _probe(spec)

    assert _check(report, "reset").status == "failed"
    assert _check(report, "reset").message == "timed out after 1.5s"
    assert 1.5 <= _check(report, "reset").latency_s < 2.5
    assert _statuses(report)["tools"] == "skipped" and _statuses(report)["step"] == "skipped"
    assert time.perf_counter() - started < 6.0


def test_an_environment_blocking_its_event_loop_still_times_out():
    spec = _python("tests.workers.probe_environments:BlockingResetEnvironment", block_s=4.0)

    started = time.perf_counter()
    report = _probe(spec)

    assert _check(report, "reset").message == "timed out after 1.5s"
    assert "abandoned" in report.checks[-1].message
    assert time.perf_counter() - started < 4.0


def test_undeclared_tools_fail_with_the_schema_to_register():
    report = _probe(CALCULATOR.model_copy(update={"tools": ()}))

    tools = _check(report, "tools")
    assert tools.status == "failed"
    assert 'exposed but not declared (register them): [{"description":' in tools.message
    assert '"name": "calc"' in tools.message


def test_a_declared_schema_that_differs_fails_the_tools_check():
    changed = CALCULATOR.tools[0].model_copy(update={"parameters": {"type": "object"}})

    report = _probe(CALCULATOR.model_copy(update={"tools": (changed,)}))

    assert _check(report, "tools").message.startswith("calc: parameters differ from the declaration")


def test_a_class_that_cannot_be_imported_fails_the_load():
    report = _probe(_python("tests.workers.nowhere:Nothing"))

    assert _check(report, "load").status == "failed"
    assert "cannot import 'tests.workers.nowhere'" in _check(report, "load").message
    assert _statuses(report)["close"] == "skipped"


def test_settings_the_class_does_not_take_fail_the_load():
    report = _probe(_python(CALCULATOR.entrypoint, colour="blue"))

    assert "unexpected keyword argument 'colour'" in _check(report, "load").message


@pytest.mark.parametrize("url", ["http://169.254.169.254/latest", "http://localhost:1/"])
def test_urls_are_checked_on_the_worker_after_resolving(url):
    spec = EnvironmentSpec(name="remote", kind="http", settings={"url": url})

    report = _probe(spec, url_allowlist=("10.0.0.0/8",))

    assert _check(report, "url").status == "failed"
    assert _statuses(report)["load"] == "skipped"


def test_a_metadata_address_is_refused_without_an_allow_list():
    spec = EnvironmentSpec(name="remote", kind="http", settings={"url": "http://169.254.169.254/"})

    report = _probe(spec)

    assert "link-local or cloud-metadata" in _check(report, "url").message
