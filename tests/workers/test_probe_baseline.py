"""The registration probe's baseline: a few held-out episodes of the imported model, its tool-call rate.

In this process, against the built-in environments; tests/workers/test_probe_worker.py runs it through a
real worker and the platform."""

from __future__ import annotations

import pytest

from environment_registry.builtin import CALCULATOR_PRODUCTS
from tandem.contracts import ProbeBaseline, ProbeBaselineRequest, ProbeRequest, ProbeTimeouts
from workers.probe import CheckWarning, baseline_verdict, run_probe

FAST = ProbeTimeouts(url=5, load=10, reset=5, tools=5, step=5, close=5)
# A few short greedy episodes: what the test needs to see is whether a call was made.
SHORT = {"episodes": 4, "max_new_tokens": 48, "max_turns": 2, "max_seq_len": 512}


def _probe(spec, baseline: ProbeBaselineRequest | None, purpose="registration"):
    return run_probe(ProbeRequest(probe_id=1, purpose=purpose, environment=spec, timeouts=FAST, baseline=baseline))


def _check(report, name):
    return next(check for check in report.checks if check.name == name)


def test_smollm2_never_calls_the_calculator_at_3_digit_products_and_the_probe_warns_so(smollm2):
    report = _probe(CALCULATOR_PRODUCTS, ProbeBaselineRequest(model=str(smollm2), **SHORT))

    assert [check.name for check in report.checks][-2:] == ["close", "baseline"]
    # The environment is fine: the model's habits are a warning, not a failed probe.
    assert report.passed, report.checks
    baseline = report.baseline
    assert baseline is not None and baseline.model == str(smollm2)
    assert baseline.episodes == SHORT["episodes"] == sum(baseline.statuses.values())
    assert baseline.statuses.get("failed", 0) == 0, baseline
    # Measured on 64 held-out episodes too (bench/tool_learning.py's imported arm): 0 calls.
    assert baseline.tool_call_rate == 0.0
    assert baseline.tool_use["tool_calls_per_episode"] == 0.0
    low, high = baseline.tool_use_ci95["tool_call_rate"]
    assert low == 0.0 < high < 1.0
    check = _check(report, "baseline")
    assert check.status == "warning"
    assert "never called a tool" in check.message and "tool-call rate 0" in check.message
    assert check.timeout_s == FAST.baseline


def test_a_model_outside_the_model_roots_is_refused_before_a_file_of_it_is_read(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    report = _probe(CALCULATOR_PRODUCTS, ProbeBaselineRequest(model=str(tmp_path), **SHORT))

    check = _check(report, "baseline")
    assert check.status == "warning"
    assert "TANDEM_MODEL_ROOTS" in check.message
    assert report.baseline is None
    assert report.passed  # the environment's checks all passed


def test_no_baseline_is_played_after_a_failed_check_or_unless_asked():
    broken = CALCULATOR_PRODUCTS.model_copy(update={"entrypoint": "environments.builtin.calculator:NoSuchClass"})
    report = _probe(broken, ProbeBaselineRequest(model="var/models/never-loaded", **SHORT))
    assert _check(report, "baseline").status == "skipped"
    assert report.baseline is None

    unasked = _probe(CALCULATOR_PRODUCTS, None)
    assert "baseline" not in [check.name for check in unasked.checks]
    assert unasked.baseline is None


@pytest.mark.parametrize(("tool_use", "warned", "words"), [
    ({}, False, "offered no tools"),
    ({"tool_call_rate": 0.0, "tool_calls_per_episode": 0.0}, True, "never called a tool"),
    ({"tool_call_rate": 0.25, "tool_calls_per_episode": 0.5, "tool_parse_failure_rate": 0.5}, False,
     "0.5 of the turns that wrote call markup did not parse"),
])
def test_the_verdict_warns_only_when_tools_were_offered_and_never_called(tool_use, warned, words):
    baseline = ProbeBaseline(model="m", episodes=4, statuses={"ok": 4}, mean_reward=0.0, tool_use=tool_use,
                             tool_use_ci95={"tool_call_rate": (0.0, 0.5)} if tool_use else {}, wall_s=1.0)
    if warned:
        with pytest.raises(CheckWarning, match=words):
            baseline_verdict(baseline)
    else:
        assert words in baseline_verdict(baseline)
