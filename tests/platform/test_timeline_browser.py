"""The timeline page in real Chromium against a real uvicorn, fed by step events the trainer's own
client posts: the trainer's stages and every episode drawn on one axis, idle gaps visible, live.

The screenshot goes to test-artifacts/timeline.png (gitignored), for people to look at.
"""

from __future__ import annotations

import random
import time

import pytest

from tandem.contracts import TrainerStepEvent
from trainer.platform_client import PlatformClient

from .builders import episode_span, timeline_event
from .conftest import TRAINER_NAME
from .test_dashboard_browser import chromium_page  # noqa: F401 (a fixture)
from .test_run_page_browser import REPO_ROOT

pytestmark = pytest.mark.django_db(transaction=True)

GROUPS_PER_STEP, GROUP_SIZE = 2, 4
STALLED_STEP = 10  # producers stall before it: the trainer waits 3 s with no episode running
STALE_STEP = 6  # consumes, besides its own, an old group it drops as stale


def simulated_run(run_id: int, steps: range, *, t0: float, rng: random.Random) -> list[TrainerStepEvent]:
    """An asynchronous run as the trainer reports it: each step's episodes ran while the step
    before it trained, and finished before the step's data_wait ended."""
    events, start = [], t0
    for step in steps:
        wait = 3.0 if step == STALLED_STEP else rng.uniform(0.05, 0.5)
        stages = (("data_wait", wait), ("batch", 0.05), ("host_to_device", 0.02), ("compute", 0.6),
                  ("publish", 0.08), ("checkpoint", 0.12 if step % 5 == 0 else 0.0), ("telemetry", 0.03))
        episodes = []
        for group in range(GROUPS_PER_STEP):
            for index in range(GROUP_SIZE):
                seconds = rng.uniform(0.7, 1.4)
                if step == STALLED_STEP:
                    finished = start + rng.uniform(2.3, wait - 0.05)
                    seconds = min(seconds, finished - start - 1.6)
                else:
                    finished = start + rng.uniform(-0.6, wait - 0.01)
                episodes.append(episode_span(
                    f"s{step}g{group}", index, started_at=finished - seconds, seconds=seconds,
                    policy_version=step - 1, status="failed" if (step % 3, group, index) == (0, 1, 2) else "ok",
                ))
        if step == STALE_STEP:
            episodes += [episode_span("old", index, started_at=start - 6.0 + 0.1 * index, seconds=1.2,
                                      outcome="dropped_stale", policy_version=0) for index in range(GROUP_SIZE)]
        events.append(TrainerStepEvent.model_validate(
            timeline_event(run_id, step, started_at=start, stages=[s for s in stages if s[1]],
                           episodes=episodes, policy_version=step)))
        start += sum(seconds for _, seconds in stages)
    return events


def test_the_timeline_draws_every_step_and_episode_and_follows_the_run(
    server, chromium_page, running_run, trainer  # noqa: F811
):
    rng = random.Random(0)
    t0 = time.time() - 40
    history = simulated_run(running_run.pk, range(1, 21), t0=t0, rng=rng)
    # Posted as the trainer posts them: its platform client, over HTTP.
    client = PlatformClient(server, trainer.raw_token, trainer_name=TRAINER_NAME)
    client.post_events(running_run.pk, history)

    stages = sum(len(event.timeline.spans) for event in history)
    window_start = history[0].timeline.spans[0].started_at
    in_window = [e for event in history for e in event.episodes if e.finished_at >= window_start]
    failed = sum(e.status == "failed" for e in in_window)
    dropped = sum(e.outcome == "dropped_stale" for e in in_window)
    assert failed == 6 and dropped == GROUP_SIZE

    # No ORM calls from here on: Playwright's sync API keeps an event loop running in this thread.
    page = chromium_page(server, f"/runs/{running_run.pk}/timeline/")
    page.wait_for_function("() => window.tandemTimeline && window.tandemTimeline.steps === 20")
    drawn = page.evaluate("() => ({...window.tandemTimeline})")
    assert drawn["stageSegments"] == stages
    assert drawn["idleSegments"] == 20  # every step's data_wait
    assert drawn["episodeBars"] == len(in_window) > 20 * GROUPS_PER_STEP * GROUP_SIZE - 8
    assert drawn["episodeBars"] + drawn["episodesBeforeWindow"] == sum(len(e.episodes) for e in history)
    assert (drawn["failedBars"], drawn["droppedBars"]) == (failed, dropped)
    assert drawn["producerRows"] >= 2  # concurrent episodes stack
    assert "trainer idle" in page.inner_text("#timeline-summary")

    # The colours of the legend are on the canvas: compute, the idle hatch, generation, failed.
    colours = page.evaluate("""() => {
        const c = document.getElementById('timeline-canvas');
        const data = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        const seen = new Set();
        for (let i = 0; i < data.length; i += 4) seen.add(`${data[i]},${data[i + 1]},${data[i + 2]}`);
        return ['22,163,74', '248,113,113', '59,130,246', '245,158,11', '220,38,38'].filter(c => seen.has(c));
    }""")
    assert colours == ["22,163,74", "248,113,113", "59,130,246", "245,158,11", "220,38,38"]

    # The stalled step's long wait is a hatched stretch with no episode running above the bars.
    stalled = history[STALLED_STEP - 1].timeline.spans[0]
    box = page.locator("#timeline-canvas").bounding_box()
    x = page.evaluate(
        "([t0, t1, t]) => { const w = document.getElementById('timeline-chart').clientWidth;"
        " return 84 + (t - t0) / (t1 - t0) * (w - 84 - 12); }",
        [window_start, history[-1].timeline.spans[-1].ended_at, (stalled.started_at + stalled.ended_at) / 2 - 0.5],
    )
    page.mouse.move(box["x"] + x, box["y"] + 22 + 14 + 13)
    page.wait_for_selector("#timeline-tooltip:not([hidden])")
    tooltip = page.inner_text("#timeline-tooltip")
    assert f"step {STALLED_STEP} " in tooltip and "data_wait (idle" in tooltip and "3.00 s" in tooltip
    page.wait_for_function(f"() => window.tandemTimeline.draws > {drawn['draws']}")  # the step lit up
    page.screenshot(path=str(REPO_ROOT / "test-artifacts" / "timeline_hover.png"), full_page=True)
    page.mouse.move(0, 0)
    page.screenshot(path=str(REPO_ROOT / "test-artifacts" / "timeline.png"), full_page=True)

    # Dragging across the stalled step zooms into it; double-clicking shows the whole window again.
    y = box["y"] + 22 + 14 + 13
    page.mouse.move(box["x"] + x - 60, y)
    page.mouse.down()
    page.mouse.move(box["x"] + x + 60, y, steps=4)
    page.mouse.up()
    page.wait_for_function("() => window.tandemTimeline.zoomed")
    zoomed = page.evaluate("() => ({...window.tandemTimeline})")
    assert zoomed["stepsInView"] < 5 and zoomed["episodeBars"] < drawn["episodeBars"]
    assert page.is_visible("#timeline-zoom-reset")
    page.screenshot(path=str(REPO_ROOT / "test-artifacts" / "timeline_zoomed.png"), full_page=True)
    page.dblclick("#timeline-canvas", position={"x": x, "y": 22 + 14 + 13})
    page.wait_for_function("() => !window.tandemTimeline.zoomed")
    assert page.evaluate("window.tandemTimeline.episodeBars") == drawn["episodeBars"]

    # While the run trains the page follows it: two more steps appear without a reload.
    polls = drawn["polls"]
    more = simulated_run(running_run.pk, range(21, 23), t0=history[-1].timeline.spans[-1].ended_at, rng=rng)
    client.post_events(running_run.pk, more)
    client.close()
    page.wait_for_function("() => window.tandemTimeline.steps === 22", timeout=15_000)
    assert page.evaluate("window.tandemTimeline.polls") > polls
    assert page.evaluate("window.tandemTimeline.lastError") is None
