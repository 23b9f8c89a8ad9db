"""In real Chromium against a real uvicorn: the generated new-run form, and an environment
registered through the UI and probed by real workers (`tandem worker`, `tandem platform-worker`).

Screenshots go to test-artifacts/screenshots/ (gitignored), for people to look at.
"""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest

from environment_registry.builtin import CALCULATOR
from environment_registry.services import environment_register
from tandem.run_config import RunConfig
from tests.workers.test_probe_worker import processes  # noqa: F401 - the real worker processes

from .test_dashboard_browser import SCREENSHOTS, chromium_page  # noqa: F401 - the browser fixture

pytestmark = pytest.mark.django_db(transaction=True)

# A worker imports JAX before it takes its first probe; the machine may be busy.
PROBE_TIMEOUT_S = 180


def test_the_generated_form_shows_an_inline_error_then_creates_the_run(
    server, chromium_page, user, project, environment  # noqa: F811
):
    environment_register(user=user, project=project, spec=CALCULATOR.model_copy(update={"name": "fresh"}))
    # No ORM calls from here on: Playwright's sync API keeps an event loop running in this thread.
    page = chromium_page(server, "/runs/")
    page.click("#new-run-link")
    page.wait_for_url("**/runs/new/")
    assert page.inner_text("#environment-health-status") == "Ready"
    assert "ago" in page.inner_text("#environment-health-probed")
    # Picking another environment shows its health instead.
    page.select_option("#id_environment", f"{project.pk}:fresh@1")
    assert page.inner_text("#environment-health-status") == "Probe pending"
    assert page.get_attribute("#environment-health-status", "class") == "badge badge-pending"
    page.select_option("#id_environment", f"{project.pk}:{environment.name}@1")
    assert page.inner_text("#environment-health-status") == "Ready"
    page.screenshot(path=str(SCREENSHOTS / "run_new_form.png"), full_page=True)

    page.fill("#id_name", "from-the-form")
    page.fill("#id_config_rl_steps", "5")
    # Picking dapo shows its preset, which the user then changes.
    page.select_option("#id_config_algorithm__name", "dapo")
    assert page.input_value("#id_config_algorithm__epsilon_high") == "0.28"
    assert page.is_checked("#id_config_algorithm__dynamic_sampling")
    assert json.loads(page.input_value("#id_config_algorithm__overlong"))["penalty_factor"] == 1.0
    page.fill("#id_config_algorithm__epsilon_high", "12")
    page.locator("#id_config_algorithm__epsilon_high").blur()
    # Checked on blur from the schema's bounds, before anything is sent.
    epsilon = page.locator(".config-field[data-path='algorithm.epsilon_high']")
    assert epsilon.locator(".client-error").inner_text() == "Must be at most 10."
    page.check("#id_config_model__qk_norm")
    # A rule across fields, checked by the server on blur before the submit.
    page.fill("#id_config_model__num_heads", "3")
    page.locator("#id_config_model__num_heads").blur()
    model_error = page.locator("#config-section-model > .section-error")
    model_error.wait_for()
    assert "num_heads must divide d_model" in model_error.inner_text()
    page.locator("#config-section-model").screenshot(path=str(SCREENSHOTS / "run_new_section_error.png"))
    page.fill("#id_config_model__num_heads", "4")
    page.locator("#id_config_model__num_heads").blur()
    model_error.wait_for(state="detached")
    page.click("#start-run")
    page.wait_for_load_state()

    # RunConfig's own verdict, inline at the field, with every input kept.
    assert "/runs/new/" in page.url
    assert "less than or equal to 10" in epsilon.locator(".field-error").inner_text()
    assert "has-error" in epsilon.get_attribute("class")
    assert page.input_value("#id_config_algorithm__epsilon_high") == "12"
    assert page.input_value("#id_config_rl_steps") == "5"
    assert page.input_value("#id_name") == "from-the-form"
    assert page.is_checked("#id_config_model__qk_norm")
    assert page.input_value("#id_config_algorithm__name") == "dapo"
    assert page.is_checked("#id_config_algorithm__dynamic_sampling")
    page.locator(".config-field[data-path='algorithm.epsilon_high']").scroll_into_view_if_needed()
    page.screenshot(path=str(SCREENSHOTS / "run_new_inline_error.png"), full_page=True)

    page.fill("#id_config_algorithm__epsilon_high", "0.3")
    page.locator("#id_config_algorithm__epsilon_high").blur()
    assert epsilon.locator(".field-error").count() == 0
    page.click("#start-run")
    page.wait_for_url(re.compile(r".*/runs/\d+/$"))
    run_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    page.screenshot(path=str(SCREENSHOTS / "run_new_created.png"), full_page=True)

    run = httpx.get(f"{server}/api/runs/{run_id}/",
                    headers={"Authorization": f"Token {user.raw_token}"}).json()
    assert run["name"] == "from-the-form"
    expected = RunConfig.model_validate({
        "rl_steps": 5, "algorithm": {"name": "dapo", "epsilon_high": 0.3}, "model": {"qk_norm": True},
    }).model_dump(mode="json")
    assert run["config"] == expected


def _register_in_the_ui(page, project, name: str, tools: str) -> None:
    page.select_option("#id_project", str(project.pk))
    page.fill("#id_name", name)
    page.select_option("#id_kind", "python")
    page.fill("#id_entrypoint", "environments.builtin.calculator:CalculatorEnvironment")
    page.fill("#id_tools", tools)
    page.click("#register-environment-form button[type=submit]")
    page.wait_for_url(re.compile(r".*/environments/\d+/$"))


def _settled_badge(page) -> str:
    """The version's status once a worker reported its probe (the page is reloaded until then)."""
    deadline = time.monotonic() + PROBE_TIMEOUT_S
    badge = page.locator("#version-1 .run-header .badge")
    while badge.inner_text() == "Probe pending":
        assert time.monotonic() < deadline, f"no probe report within {PROBE_TIMEOUT_S}s"
        time.sleep(1)
        page.reload()
    return badge.inner_text()


def test_an_environment_registered_in_the_ui_shows_its_probe_report_and_health_in_the_picker(
    processes, server, chromium_page, user, project  # noqa: F811
):
    tools = [tool.model_dump(mode="json") for tool in CALCULATOR.tools]
    wrong_tools = [{**tools[0], "parameters": {"type": "object", "properties": {}}}]

    page = chromium_page(server, "/environments/")
    _register_in_the_ui(page, project, "ui-calculator", json.dumps(tools))
    assert _settled_badge(page) == "Ready", page.inner_text("#version-1")
    checks = page.locator("#version-1 .probe-checks tbody tr td:first-child").all_inner_texts()
    assert {"load", "reset", "tools", "step"} <= set(checks)
    assert page.locator("#version-1 .probe-checks .badge-passed").count() == len(checks)
    page.screenshot(path=str(SCREENSHOTS / "environment_probed.png"), full_page=True)

    # One whose declared tool schema is not what the environment exposes fails its probe.
    page.goto(f"{server}/environments/")
    _register_in_the_ui(page, project, "ui-mismatched", json.dumps(wrong_tools))
    assert _settled_badge(page) == "Probe failed"
    assert "parameters differ from the declaration" in page.inner_text("#version-1 .status-reason")

    page.goto(f"{server}/runs/new/")
    mismatched = page.locator(f"#id_environment option[value='{project.pk}:ui-mismatched@1']")
    assert mismatched.is_disabled()
    page.select_option("#id_environment", f"{project.pk}:ui-calculator@1")
    assert page.inner_text("#environment-health-status") == "Ready"
    assert page.inner_text("#environment-health-probed").endswith("ago")
    page.screenshot(path=str(SCREENSHOTS / "run_new_environment_health.png"))
