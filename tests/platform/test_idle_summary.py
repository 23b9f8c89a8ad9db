"""What the trainer waited on, in words: the idle share of a run's newest steps by environment and cause
(trainer/idle_attribution.py sends it; telemetry.selectors.idle_summary sums it), on the API, the run
page and the timeline page."""

from __future__ import annotations

import httpx
import pytest
from django.test import Client
from playwright.sync_api import sync_playwright

from tandem.contracts import TRAINER_HEADER, TrainerStepEvent
from telemetry.selectors import idle_summary
from telemetry.services import metric_events_record
from tests.browser import launch_chromium, log_in

from .builders import step_event
from .conftest import TRAINER_NAME

# A step of 10 s that waited 4.4 s: 3 s on the `shout` environment's steps, 1 s generating, 0.4 s queued.
IDLE = {"shout": {"environment": 3.0, "generation": 1.0, "queue": 0.4}}
SENTENCE = "trainer idle 44% over the last 2 steps: 30% waiting on `shout` environment steps, 10% on generation, 4% in queue"


def _step(run_id: int, step: int, **overrides) -> dict:
    return step_event(run_id, step, wall_s=10.0, wait_s=4.4, compute_s=5.0, publish_s=0.3, other_s=0.3,
                      idle_seconds=IDLE, **overrides)


def _record(run, *steps: int) -> None:
    metric_events_record(run=run, events=[TrainerStepEvent.model_validate(_step(run.pk, step)) for step in steps])


@pytest.mark.django_db
def test_the_idle_of_the_newest_steps_is_summed_by_environment_and_cause(running_run):
    assert idle_summary(run=running_run) is None  # no step yet
    _record(running_run, 1, 2)

    summary = idle_summary(run=running_run)

    assert (summary.steps, summary.idle_fraction) == (2, pytest.approx(0.44))
    assert [(share.environment, share.cause) for share in summary.shares] == [
        ("shout", "environment"), ("shout", "generation"), ("shout", "queue")]
    assert summary.sentence == SENTENCE
    # Only the newest steps count: an old step that waited on tools is out of a window of 2.
    metric_events_record(run=running_run, events=[TrainerStepEvent.model_validate(step_event(
        running_run.pk, 0, wall_s=10.0, wait_s=9.0, compute_s=0.5, publish_s=0.25, other_s=0.25,
        idle_seconds={"slow": {"tool": 9.0}}))])
    assert idle_summary(run=running_run, last_steps=2).sentence == SENTENCE
    several = idle_summary(run=running_run, last_steps=3)
    assert several.sentence.startswith("trainer idle 59% over the last 3 steps: 30% waiting on `slow` tool calls, "
                                       "20% on `shout` environment steps, 7% on `shout` generation")


@pytest.mark.django_db
def test_the_api_the_timeline_and_the_run_page_say_it(api, running_run, user):
    assert api.get(f"/api/runs/{running_run.pk}/idle/").json() == {"run": running_run.pk, "idle": None}
    _record(running_run, 1, 2)

    body = api.get(f"/api/runs/{running_run.pk}/idle/").json()["idle"]
    assert body["sentence"] == SENTENCE and body["idle_fraction"] == pytest.approx(0.44)
    assert body["shares"][0] == {"environment": "shout", "cause": "environment", "fraction": pytest.approx(0.3)}
    assert api.get(f"/api/runs/{running_run.pk}/timeline/").json()["idle"]["sentence"] == SENTENCE
    page = Client()
    page.force_login(user)
    html = page.get(f"/runs/{running_run.pk}/").content.decode()
    assert "trainer idle 44% over the last 2 steps: 30% waiting on `shout` environment steps" in html.replace(
        "&#x60;", "`")


@pytest.mark.django_db(transaction=True)
def test_the_run_page_and_the_timeline_show_it_as_steps_come(server, running_run, trainer):
    trainer_http = httpx.Client(
        base_url=server, headers={"Authorization": f"Token {trainer.raw_token}", TRAINER_HEADER: TRAINER_NAME})

    def post_step(step: int) -> None:
        response = trainer_http.post(f"/api/trainer/runs/{running_run.pk}/telemetry/",
                                     json={"events": [_step(running_run.pk, step)]})
        assert response.status_code == 202, response.text

    with sync_playwright() as playwright:
        browser = launch_chromium(playwright)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        errors: list[str] = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
        log_in(page, server, f"/runs/{running_run.pk}/", username="alice", password="pw")
        page.wait_for_function("() => document.querySelector('#run-connection').textContent === 'live'")
        assert page.is_hidden("#run-idle")

        post_step(1)
        post_step(2)
        page.wait_for_function(
            "text => document.querySelector('#run-idle').textContent === text",
            arg=SENTENCE, timeout=20_000)
        assert page.is_visible("#run-idle")

        page.goto(f"{server}/runs/{running_run.pk}/timeline/")
        page.wait_for_function("text => document.querySelector('#timeline-idle').textContent === text",
                               arg=SENTENCE, timeout=20_000)
        browser.close()
    assert errors == []
