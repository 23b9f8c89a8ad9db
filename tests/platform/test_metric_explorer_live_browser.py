"""The metric explorer on a run page in real Chromium against a real uvicorn: a long series is read
bucketed (the panel holds far fewer points than the series has), and a step the trainer posts reaches
the panel over the page's WebSocket without a reload.

Any page error or console error fails the test. The screenshot goes to test-artifacts/screenshots/.
"""

from __future__ import annotations

import httpx
from django.utils import timezone

from tandem.contracts import TRAINER_HEADER
from telemetry.models import MetricPoint
from telemetry.services import metric_buckets_rebuild

from .builders import step_event
from .conftest import TRAINER_NAME
from .test_metric_explorer_browser import SCREENSHOTS, open_page, pytestmark  # noqa: F401 (fixture, marks)

LONG_SERIES_STEPS = 20_000


def _log_long_loss(run) -> None:
    """``loss`` at steps 1 to LONG_SERIES_STEPS, stored in bulk and bucketed by the platform's rebuild."""
    now = timezone.now()
    MetricPoint.objects.bulk_create(
        [MetricPoint(run=run, step=step, name="loss", value=1.0 / step, recorded_at=now)
         for step in range(1, LONG_SERIES_STEPS + 1)],
        batch_size=5000,
    )
    metric_buckets_rebuild(run=run)


def test_a_long_series_is_read_bucketed_and_a_live_step_joins_its_panel_without_a_reload(
    server, open_page, running_run, user, trainer  # noqa: F811 (open_page is the explorer tests' fixture)
):
    _log_long_loss(running_run)
    user_http = httpx.Client(base_url=server, headers={"Authorization": f"Token {user.raw_token}"})
    saved = user_http.put("/api/metric-explorer/layout/", json={
        "page": "run", "smoothing": 0, "panels": [{"pattern": "loss", "x_axis": "step"}],
    })
    assert saved.status_code == 200, saved.text
    trainer_http = httpx.Client(
        base_url=server, headers={"Authorization": f"Token {trainer.raw_token}", TRAINER_HEADER: TRAINER_NAME}
    )

    # No ORM calls from here on: Playwright's sync API keeps an event loop running in this thread.
    page = open_page(server, f"/runs/{running_run.pk}/")
    page.wait_for_function("window.tandemMetricExplorer.ready && window.tandemMetricExplorer.panels[0].plot")
    read = page.evaluate("""(() => { const p = window.tandemMetricExplorer.panels[0];
        return {source: p.source, points: p.points[0], resolution: p.tables[0].resolution,
                last_x: p.plot.data[0][p.plot.data[0].length - 1]}; })()""")
    assert read["source"] == "buckets"
    assert read["resolution"] > 1
    assert 0 < read["points"] < LONG_SERIES_STEPS / 5, read  # buckets, not every raw point
    assert read["last_x"] <= LONG_SERIES_STEPS
    page.wait_for_function("document.querySelector('#run-connection').textContent === 'live'")

    # A step far past the buckets read starts a bucket of its own, drawn at that step.
    live_step = LONG_SERIES_STEPS + 10 * read["resolution"]
    posted = trainer_http.post(f"/api/trainer/runs/{running_run.pk}/telemetry/",
                               json={"events": [step_event(running_run.pk, live_step)]})
    assert posted.status_code == 202, posted.text
    page.wait_for_function(f"""(() => {{ const u = window.tandemMetricExplorer.panels[0].plot;
        return u.data[0][u.data[0].length - 1] === {live_step}; }})()""", timeout=10_000)
    live = page.evaluate("""(() => { const e = window.tandemMetricExplorer; const u = e.panels[0].plot;
        return {value: u.data[1][u.data[1].length - 1], points: e.panels[0].points[0], redraws: e.redraws,
                liveSteps: e.liveSteps, navigations: performance.getEntriesByType('navigation').length}; })()""")
    assert live["value"] == 1.0 / (live_step + 1)  # the step event's loss
    assert live["points"] == read["points"] + 1
    assert live["redraws"] >= 1 and live["liveSteps"] >= 1
    assert live["navigations"] == 1  # no reload
    page.locator("#metric-explorer").screenshot(path=str(SCREENSHOTS / "metric_explorer_live_bucketed.png"))
