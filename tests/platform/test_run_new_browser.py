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
from runs.config_form import config_form
from tandem.configs.run import RunConfig
from tests.polling import poll_until
from tests.workers.test_probe_worker import processes  # noqa: F401 - the real worker processes

from .test_dashboard_browser import SCREENSHOTS, chromium_page  # noqa: F401 - the browser fixture

pytestmark = pytest.mark.django_db(transaction=True)

# A worker imports JAX before it takes its first probe; the machine may be busy.
PROBE_TIMEOUT_S = 180


@pytest.fixture
def console_errors():
    """``watch(page)``: the page's console errors fail the test (its script errors already do)."""
    errors: list[str] = []

    def watch(page):
        page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
        return page

    yield watch
    assert errors == [], errors


def _in_view(page, selector: str) -> bool:
    return page.evaluate("""(selector) => {
        const box = document.querySelector(selector).getBoundingClientRect();
        return box.top >= 0 && box.bottom <= window.innerHeight;
    }""", selector)


def _fill_folded(page, section: str, selector: str, value: str) -> None:
    """Open a folded section, fill one of its fields, and fold it again."""
    page.click(f"#config-section-{section} > summary")
    page.fill(selector, value)
    page.click(f"#config-section-{section} > summary")


def test_the_form_folds_its_sections_fills_presets_edits_rows_flags_every_error_and_reviews_before_starting(
    server, chromium_page, console_errors, user, project, environment  # noqa: F811
):
    environment_register(user=user, project=project, spec=CALCULATOR.model_copy(update={"name": "fresh"}))
    # No ORM calls from here on: Playwright's sync API keeps an event loop running in this thread.
    page = console_errors(chromium_page(server, "/runs/"))
    page.click("#new-run-link")
    page.wait_for_url("**/runs/new/")
    assert page.inner_text("#environment-health-status") == "Ready"
    assert "ago" in page.inner_text("#environment-health-probed")
    # Picking another environment shows its health instead.
    page.select_option("#id_environment", f"{project.pk}:fresh@1")
    assert page.inner_text("#environment-health-status") == "Probe pending"
    assert page.get_attribute("#environment-health-status", "class") == "badge badge-pending"
    page.select_option("#id_environment", f"{project.pk}:{environment.name}@1")

    # The basics are open; every section of the config is folded, its fields out of sight.
    assert page.is_visible("#id_config_rl_steps") and page.is_visible("#id_config_algorithm__name")
    assert page.locator("#config-section-basics label[for=id_config_rl_learning_rate]").inner_text() == "RL learning rate"
    folded = page.locator("details.config-section")
    assert folded.count() == len(config_form().advanced) == 14
    assert page.evaluate("Array.from(document.querySelectorAll('details.config-section')).every((d) => !d.open)")
    assert not page.is_visible("#id_config_rollout__group_size")
    assert not page.is_visible("#id_config_evaluation__tasks")  # evaluation is off
    page.screenshot(path=str(SCREENSHOTS / "run_new_form.png"), full_page=True)

    # A preset fills its fields and says what it changed.
    page.click("#preset-fast-demo")
    assert page.input_value("#id_config_rl_steps") == "4" and page.input_value("#id_config_sft_steps") == "4"
    summary = page.inner_text("#preset-summary")
    assert summary.startswith("Fast demo: changed ")
    assert "SFT steps 300 → 4" in summary and "Group size 8 → 4" in summary
    assert page.inner_text("#config-section-rollout > summary .changed-count") == "3 changed"
    # Picking an algorithm fills its section with its preset.
    page.select_option("#id_config_algorithm__name", "dapo")
    assert page.input_value("#id_config_algorithm__epsilon_high") == "0.28"
    assert page.is_checked("#id_config_algorithm__dynamic_sampling") and page.is_checked("#id_config_algorithm__overlong")
    assert "Algorithm grpo → dapo" in page.inner_text("#preset-summary")
    # A field is checked on blur from the schema's bounds, before anything is sent.
    page.click("#config-section-algorithm > summary")
    page.fill("#id_config_algorithm__epsilon_high", "12")
    page.locator("#id_config_algorithm__epsilon_high").blur()
    epsilon = page.locator(".config-field[data-path='algorithm.epsilon_high']")
    assert epsilon.locator(".client-error").inner_text() == "Must be at most 10."
    page.fill("#id_config_algorithm__epsilon_high", "0.28")
    page.locator("#id_config_algorithm__epsilon_high").blur()
    assert epsilon.locator(".field-error").count() == 0
    page.click("#config-section-algorithm > summary")

    # Dataset rows: added, filled, removed; the rows left are numbered again.
    add = page.locator("[data-rows-add='sft.datasets']")
    add.click()
    add.click()
    page.fill("#id_config_sft__datasets__0__name", "first")
    page.fill("#id_config_sft__datasets__1__name", "second")
    page.fill("#id_config_sft__datasets__1__weight", "3")
    page.locator("[data-rows='sft.datasets'] .config-row").first.locator(".row-remove").click()
    assert page.locator("[data-rows='sft.datasets'] .config-row").count() == 1
    assert page.input_value("#id_config_sft__datasets__0__name") == "second"
    assert page.get_attribute("#id_config_sft__datasets__0__weight", "name") == "config.sft.datasets.0.weight"
    page.screenshot(path=str(SCREENSHOTS / "run_new_rows.png"), full_page=True)
    page.locator("[data-rows='sft.datasets'] .row-remove").click()  # no such dataset here
    assert page.locator("[data-rows='sft.datasets'] .config-row").count() == 0

    # Two malformed fields in folded sections and a rule across fields: all flagged at once.
    _fill_folded(page, "model", "#id_config_model__rope_scaling", "{oops")
    _fill_folded(page, "model", "#id_config_model__num_heads", "3")
    _fill_folded(page, "rollout", "#id_config_rollout__timeout_s", "soon")
    page.evaluate("window.scrollTo(0, 0)")
    page.click("#review-run")
    page.locator("#form-error-summary").wait_for()
    page.locator("#config-section-model > .section-error").wait_for()
    rope = page.locator(".config-field[data-path='model.rope_scaling']")
    timeout = page.locator(".config-field[data-path='rollout.timeout_s']")
    assert rope.locator(".field-error").inner_text().startswith("Not valid JSON")
    assert timeout.locator(".field-error").inner_text() == "Enter a number."
    assert "num_heads must divide d_model" in page.inner_text("#config-section-model > .section-error")
    assert page.inner_text("#form-error-count") == "3"
    assert page.locator("#form-error-list a").all_inner_texts() == ["Model", "RoPE scaling", "Rollout timeout (s)"]
    # The page went to the first one, opening the folded sections that hold them.
    assert page.evaluate("window.scrollY") > 0
    assert page.evaluate("document.getElementById('config-section-model').open")
    assert page.evaluate("document.getElementById('config-section-rollout').open")
    assert _in_view(page, "#config-section-model > .section-error")
    assert not page.is_visible("#review")
    page.screenshot(path=str(SCREENSHOTS / "run_new_every_error.png"), full_page=True)

    # Fixing one field leaves the others flagged: the server's check reports every field still wrong.
    page.fill("#id_config_model__rope_scaling", "")
    page.locator("#id_config_model__rope_scaling").blur()
    page.wait_for_function("document.querySelector(\".config-field[data-path='model.rope_scaling'] .field-error\") === null")
    page.wait_for_function("document.getElementById('form-error-count').textContent === '2'")
    assert timeout.locator(".field-error").inner_text() == "Enter a number."
    assert page.locator("#config-section-model > .section-error").count() == 1
    page.fill("#id_config_model__num_heads", "4")
    page.fill("#id_config_rollout__timeout_s", "900")
    page.fill("#id_name", "from-the-form")

    # The review lists only what differs from the defaults.
    page.click("#review-run")
    page.locator("#review").wait_for()
    assert not page.is_visible("#form-body")
    changed = page.eval_on_selector_all("#review-table tbody tr", "rows => rows.map((row) => row.dataset.path)")
    assert changed == ["algorithm.name", "sft_steps", "rl_steps", "sft_batch_size", "algorithm.epsilon_high",
                       "algorithm.overlong", "algorithm.dynamic_sampling", "rollout.groups_per_step",
                       "rollout.group_size", "rollout.groups_per_task"]
    assert page.locator("#review-table tr[data-path='rl_steps'] td").all_inner_texts()[1:] == ["40", "4"]
    assert page.inner_text("#review-name") == "from-the-form"
    page.screenshot(path=str(SCREENSHOTS / "run_new_review.png"), full_page=True)
    # Back to the form, one more change, and the review shows it.
    page.click("#review-back")
    page.fill("#id_config_rl_steps", "5")
    page.click("#review-run")
    page.locator("#review-table tr[data-path='rl_steps']").wait_for()
    assert page.locator("#review-table tr[data-path='rl_steps'] td").last.inner_text() == "5"

    page.click("#start-run")
    page.wait_for_url(re.compile(r".*/runs/\d+/$"))
    run_id = int(page.url.rstrip("/").rsplit("/", 1)[1])
    page.screenshot(path=str(SCREENSHOTS / "run_new_created.png"), full_page=True)

    run = httpx.get(f"{server}/api/runs/{run_id}/",
                    headers={"Authorization": f"Token {user.raw_token}"}).json()
    assert run["name"] == "from-the-form"
    expected = RunConfig.model_validate({
        "sft_steps": 4, "sft_batch_size": 4, "rl_steps": 5, "algorithm": {"name": "dapo"},
        "rollout": {"group_size": 4, "groups_per_step": 2, "groups_per_task": 1},
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
    # The newest probe is the one shown open: a health probe (every HEALTH_INTERVAL_S here) may have
    # been asked for since, with no checks yet, and the older ones are folded. Reload until the
    # newest has its checks.
    newest = "#version-1 details.probe[open] .probe-checks"

    def newest_checks() -> list[str]:
        texts = page.locator(f"{newest} tbody tr td:first-child").all_inner_texts()
        return texts if any(texts) else []

    checks = poll_until(newest_checks, timeout_s=PROBE_TIMEOUT_S, interval_s=1, between=page.reload,
                        what=lambda: f"the newest probe's checks: {page.inner_text('#version-1')}")
    assert {"load", "reset", "tools", "step"} <= set(checks)
    assert page.locator(f"{newest} .badge-passed").count() == len(checks)
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
