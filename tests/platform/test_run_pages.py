"""The server-rendered dashboard pages (the charts themselves are in test_run_page_browser)."""

import pytest
from django.test import Client

from runs.models import Run


@pytest.fixture
def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_root_redirects_to_the_runs(browser):
    response = browser.get("/")

    assert response.status_code == 302 and response.url == "/runs/"


def test_pages_need_a_login(client, running_run):
    for path in ("/runs/", f"/runs/{running_run.pk}/"):
        response = client.get(path)
        assert response.status_code == 302 and response.url.startswith("/login/?next=")


def test_logging_in_and_out(client, user):
    assert client.get("/login/").status_code == 200

    response = client.post("/login/", {"username": "alice", "password": "pw"})
    assert response.status_code == 302 and response.url == "/runs/"
    assert client.get("/runs/").status_code == 200

    response = client.post("/logout/")
    assert response.status_code == 302 and response.url == "/login/"
    assert client.get("/runs/").status_code == 302


def test_the_runs_page_lists_the_users_runs_with_their_status(browser, running_run, make_run):
    hidden = make_run(name="someone-elses")

    html = browser.get("/runs/").content.decode()

    assert f'href="/runs/{running_run.pk}/"' in html
    assert 'class="badge badge-running"' in html
    assert hidden.name not in html


def test_the_new_run_form_starts_a_run(browser, project, environment):
    response = browser.post(
        "/runs/",
        {
            "project": project.pk,
            "environment": "calculator",
            "name": "",
            "sft_steps": 5,
            "rl_steps": 2,
        },
    )

    run = Run.objects.get()
    assert response.status_code == 302 and response.url == f"/runs/{run.pk}/"
    assert (run.config["sft_steps"], run.config["rl_steps"]) == (5, 2)
    assert run.config["rollout"]["group_size"] == 8  # the rest from RunConfig's defaults
    assert run.name.startswith("calculator-")


def test_the_new_run_form_shows_a_config_error_by_its_field(browser, project, environment):
    response = browser.post(
        "/runs/", {"project": project.pk, "environment": "calculator", "rl_steps": 10**9}
    )

    assert response.status_code == 200
    html = response.content.decode()
    # Under the RL steps input (the service named it config.rl_steps), not above the form.
    rl_steps_input = html.index('id="id_rl_steps"')
    assert '<p class="error">Input should be less than or equal to' in html[rl_steps_input:]
    assert not Run.objects.exists()


def test_the_new_run_form_checks_its_csrf_token(user, project, environment):
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)

    response = client.post("/runs/", {"project": project.pk, "environment": "calculator"})

    assert response.status_code == 403
    assert not Run.objects.exists()


def test_the_run_page_has_the_live_elements(browser, running_run):
    html = browser.get(f"/runs/{running_run.pk}/").content.decode()

    for element in (
        'id="chart-reward"',
        'id="chart-loss"',
        'id="chart-stages"',
        'id="chart-latency"',
        'id="run-status"',
        'id="run-step"',
        'id="trace-form"',
        f'href="/runs/{running_run.pk}/timeline/"',
        'href="/devices/"',
    ):
        assert element in html
    assert f'data-metrics-url="/api/runs/{running_run.pk}/metrics/"' in html
    assert f'data-websocket-path="/ws/runs/{running_run.pk}/"' in html
    assert "tandem/run_page/live.js" in html and "vendor/uplot/uPlot.iife.min.js" in html
    assert "&quot;group_size&quot;: 8" in html and "&quot;rollout&quot;: {" in html  # the config, pretty-printed


def test_another_users_run_page_is_not_found(browser, make_run):
    run = make_run()

    assert browser.get(f"/runs/{run.pk}/").status_code == 404
    assert browser.post(f"/runs/{run.pk}/cancel/").status_code == 404


def test_the_cancel_button_cancels_and_a_second_cancel_says_why_not(browser, running_run):
    asked = browser.post(f"/runs/{running_run.pk}/cancel/")
    assert asked.status_code == 200 and 'id="confirmation-form"' in asked.content.decode()
    running_run.refresh_from_db()
    assert running_run.status == "running"  # not until confirmed

    response = browser.post(f"/runs/{running_run.pk}/cancel/", {"confirmed": "yes"}, follow=True)

    running_run.refresh_from_db()
    assert running_run.status == "cancelled"
    assert "cancelled" in response.content.decode()
    assert 'id="cancel-form"' not in response.content.decode()
    assert 'id="trace-form"' not in response.content.decode()  # no next steps to trace

    again = browser.post(f"/runs/{running_run.pk}/cancel/", {"confirmed": "yes"}, follow=True)
    assert "it cannot become cancelled" in again.content.decode()


def test_static_files_are_served_without_collectstatic(browser):
    for path in (
        "/static/tandem/run_page/data.js",
        "/static/tandem/tandem.css",
        "/static/vendor/uplot/uPlot.iife.min.js",
    ):
        response = browser.get(path)
        assert response.status_code == 200, path
        b"".join(response.streaming_content)
