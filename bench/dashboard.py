"""How fast the run page shows a metric, and how fast it draws a long chart.

Starts the platform as it runs for real (uvicorn with Channels on Redis, the
platform worker and one rollout worker, which probes the environment so the
run can be claimed), claims a run and heartbeats it through the trainer's own
``PlatformClient``, opens the run page in Debian's Chromium (headless), and
posts step events as the trainer posts them, one per post, stamping each
``emitted_at = time.time()`` just before its post. The page stamps
``window.tandemRunPage.drawnAt[step] = Date.now()`` once its charts have drawn
the step (after uPlot's setData, drawing included); both clocks are this
machine's. Then it times the run page's chart code drawing 100,000 points
(``tandemRunPage.timeRender``: two series, each raw and smoothed, setData plus
drawing, the median of several fresh data sets).

Then the metric explorer: 50 series of 100,000 points each are stored on the run
(inserted in bulk, then bucketed by the platform's own ``metric_buckets_rebuild``),
the user's layout is saved through the API as 50 panels (one per series, trainer-step
axis), and the run page is loaded again: ``explorer_50x100k_draw_ms`` is the time from
the navigation to every panel drawn (``tandemMetricExplorer.drawnMs``, the median of
``--explorer-repeats`` loads). Then step events carrying all 50 series are posted live
and ``explorer_live_redraw_p95_ms`` is the p95 of the explorer's coalesced redraws
(``tandemMetricExplorer.redrawMs``: every changed panel's setData and drawing, in one
animation frame).

Then the project workspace: 200 runs of 5 metrics and 1,000 steps each (one of them claimed by a second
trainer, the others stored in bulk, ended, with four learning rates in their configs), drawn as one view of
the five metrics grouped by learning rate: ``workspace_200_runs_draw_ms`` is the time from the navigation to
every panel drawn (``tandemWorkspace.drawnMs``, the median of ``--explorer-repeats`` loads). Then steps of
the claimed run are posted live and ``workspace_live_redraw_p95_ms`` is the p95 of the workspace's
coalesced redraws (``tandemWorkspace.redrawMs``: every changed panel's data rebuilt, setData and drawing).

Prints one JSON line with ``metric_to_browser_p50_ms``, ``metric_to_browser_p95_ms``,
``render_100k_points_ms``, ``explorer_50x100k_draw_ms``, ``explorer_live_redraw_p95_ms``,
``workspace_200_runs_draw_ms`` and ``workspace_live_redraw_p95_ms``. The trainer's own telemetry buffer
(``telemetry_interval_s``) comes on top of the first figure when steps are
faster than that interval.

Usage: ``python bench/dashboard.py [--events N] [--rate STEPS_PER_S] [--redis-url URL]``
(Redis db 13 by default, flushed; an SQLite database in a temporary directory
unless ``--database-url`` is given).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
sys.path.insert(0, str(REPO_ROOT / "platform"))

from tandem.cli.stack import LocalStack, StackConfig  # noqa: E402
from tandem.contracts import TrainerHeartbeat  # noqa: E402
from tandem.runtime.local_ports import free_local_port  # noqa: E402
from tests.browser import launch_chromium, log_in  # noqa: E402
from tests.platform.builders import full_rl_step_event  # noqa: E402
from trainer.platform_client import PlatformClient  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def claim_when_ready(trainer: PlatformClient, run_id: int, *, stack: LocalStack, timeout_s: float) -> None:
    """Claim the run as a trainer does, once its environment passed the probe, and make it running."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stack.check_alive()
        claimed = trainer.claim(trainer.trainer_name)
        if claimed is not None:
            assert claimed.run_id == run_id, claimed
            trainer.heartbeat(run_id, TrainerHeartbeat(worker=trainer.trainer_name))
            return
        time.sleep(0.5)
    raise TimeoutError(f"run {run_id} was not claimable within {timeout_s}s (environment probe?)")


EXPLORER_SERIES = "algorithm/bench_{:02d}"  # a name no run page chart draws: only the explorer shows it


def explorer_value(series: int, step: int) -> float:
    """A wavy, noisy curve per series, so that a bucket's mean moves."""
    return math.sin(step / 2000 + series) + ((step * 2654435761 + series) % 1000) * 1e-4


def _django_of(stack: LocalStack) -> None:
    """Django set up on the stack's database, in this process, for a bulk load."""
    os.environ.update(stack.env())
    os.environ["DJANGO_DEBUG"] = "0"  # no query log growing over a load of millions of rows
    import django

    django.setup()


def store_explorer_series(stack: LocalStack, run_id: int, *, series: int, points: int) -> float:
    """Store ``series`` series of ``points`` steps (1 to ``points``) on the run; returns the seconds taken.

    The points go in with one bulk INSERT per series (the trainer's route would take minutes for five
    million); the chart buckets are then built by the platform's own ``metric_buckets_rebuild``.
    """
    _django_of(stack)
    from django.db import connection, transaction

    from runs.models import Run
    from telemetry.models import MetricPoint
    from telemetry.services import metric_buckets_rebuild

    started = time.perf_counter()
    table = MetricPoint._meta.db_table
    recorded_at = "2026-01-01 00:00:00+00:00"
    with transaction.atomic(), connection.cursor() as cursor:
        for index in range(series):
            name = EXPLORER_SERIES.format(index)
            cursor.executemany(
                f"INSERT INTO {table} (run_id, name, step, value, recorded_at) VALUES (%s, %s, %s, %s, %s)",
                [(run_id, name, step, explorer_value(index, step), recorded_at) for step in range(1, points + 1)],
            )
    metric_buckets_rebuild(run=Run.objects.get(pk=run_id))
    connection.close()
    return time.perf_counter() - started


#: The workspace's panels: series every full RL step event carries, so that live steps reach each panel.
WORKSPACE_METRICS = ("reward_mean", "loss", "algorithm/kl", "algorithm/entropy", "rollout/calculator/tool_call_rate")
WORKSPACE_RATES = (1e-5, 3e-5, 1e-4, 3e-4)
WORKSPACE_NAME = "workspace-bench"


def store_workspace_runs(stack: LocalStack, live_run_id: int, *, runs: int, steps: int) -> float:
    """``runs - 1`` ended runs beside the live one, each with WORKSPACE_METRICS at steps 1 to ``steps`` (the
    live run too), inserted in bulk and bucketed by ``metric_buckets_rebuild``; returns the seconds taken."""
    _django_of(stack)
    from django.db import connection, transaction
    from django.utils import timezone

    from runs.models import Run
    from telemetry.models import MetricPoint
    from telemetry.services import metric_buckets_rebuild

    started = time.perf_counter()
    live = Run.objects.get(pk=live_run_id)
    now = timezone.now()
    with transaction.atomic():
        ended = Run.objects.bulk_create([
            Run(project_id=live.project_id, environment_id=live.environment_id,
                environment_version_id=live.environment_version_id, name=f"{WORKSPACE_NAME} {index}",
                config={**live.config, "rl_learning_rate": WORKSPACE_RATES[index % len(WORKSPACE_RATES)]},
                status="finished", started_at=now, finished_at=now, trainer_step=steps, tags=["bench"])
            for index in range(1, runs)])
    table = MetricPoint._meta.db_table
    with transaction.atomic(), connection.cursor() as cursor:
        for index, run_id in enumerate([live.pk, *(run.pk for run in ended)]):
            cursor.executemany(
                f"INSERT INTO {table} (run_id, name, step, value, recorded_at) VALUES (%s, %s, %s, %s, %s)",
                [(run_id, name, step, explorer_value(index + series, step), "2026-01-01 00:00:00+00:00")
                 for series, name in enumerate(WORKSPACE_METRICS) for step in range(1, steps + 1)])
    for run in [live, *ended]:
        metric_buckets_rebuild(run=run)
    connection.close()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=150, help="step events measured")
    parser.add_argument("--rate", type=float, default=5.0, help="steps posted per second")
    parser.add_argument("--warmup", type=int, default=5, help="events posted first and not measured")
    parser.add_argument("--render-points", type=int, default=100_000)
    parser.add_argument("--render-repeats", type=int, default=7)
    parser.add_argument("--explorer-series", type=int, default=50, help="explorer panels, one series each")
    parser.add_argument("--explorer-points", type=int, default=100_000, help="points per explorer series")
    parser.add_argument("--explorer-repeats", type=int, default=3, help="page loads timed")
    parser.add_argument("--explorer-live-steps", type=int, default=100, help="live steps posted to the explorer")
    parser.add_argument("--workspace-runs", type=int, default=200, help="runs the workspace overlays")
    parser.add_argument("--workspace-steps", type=int, default=1000, help="steps per workspace run and metric")
    parser.add_argument("--redis-url", default=os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/13"))
    parser.add_argument("--database-url", default=None, help="default: SQLite in a temporary directory")
    parser.add_argument("--port", type=int, default=0, help="0: a free port")
    args = parser.parse_args()

    import redis
    from playwright.sync_api import sync_playwright

    redis.Redis.from_url(args.redis_url).flushdb()
    var_dir = Path(tempfile.mkdtemp(prefix="tandem-bench-dashboard-"))
    stack = LocalStack(StackConfig(
        redis_url=args.redis_url, port=args.port or free_local_port(), var_dir=var_dir, workers=1,
        database_url=args.database_url or f"sqlite:///{var_dir / 'bench.sqlite3'}",
    ))
    credentials = stack.prepare()
    load_before = os.getloadavg()
    try:
        stack.start_web()
        stack.start_platform_worker()
        stack.start_workers()
        base = stack.config.platform_url
        api = httpx.Client(base_url=base, headers={"Authorization": f"Token {credentials.user_token}"}, timeout=10)
        created = api.post("/api/runs/", json={
            "project": credentials.project_id, "name": "dashboard bench", "environment": "calculator",
            "config": {"rl_steps": 1_000_000},
        })
        created.raise_for_status()
        run_id = created.json()["id"]
        trainer = PlatformClient(base, credentials.trainer_token, trainer_name="bench-dashboard:1")
        claim_when_ready(trainer, run_id, stack=stack, timeout_s=180)

        with sync_playwright() as playwright:
            browser = launch_chromium(playwright)
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            log_in(page, base, f"/runs/{run_id}/", username=credentials.username, password=credentials.password)
            page.wait_for_function("() => document.querySelector('#run-connection').textContent === 'live'")

            emitted_ms: dict[int, float] = {}
            interval = 1.0 / args.rate
            total = args.warmup + args.events
            started = time.monotonic()
            for step in range(1, total + 1):
                event = full_rl_step_event(run_id, step)
                event = event.model_copy(update={"emitted_at": time.time()})
                trainer.post_events(run_id, [event])
                if step > args.warmup:
                    emitted_ms[step] = event.emitted_at * 1000
                # Paced like a trainer finishing a step every `interval` seconds.
                time.sleep(max(0.0, started + step * interval - time.monotonic()))
            page.wait_for_function(f"() => window.tandemRunPage.drawnAt[{total}] !== undefined", timeout=30_000)
            drawn = page.evaluate("({...window.tandemRunPage.drawnAt})")
            redraws = page.evaluate("window.tandemRunPage.redraws")
            missing = [step for step in emitted_ms if str(step) not in drawn]
            latencies = [drawn[str(step)] - emitted_ms[step] for step in emitted_ms if str(step) in drawn]

            render = page.evaluate(
                "([points, repeats]) => window.tandemRunPage.timeRender(points, repeats)",
                [args.render_points, args.render_repeats],
            )

            # The metric explorer: 50 panels of 100,000-point series, loaded, then live.
            # In a thread of its own: Django refuses the ORM where Playwright's event loop runs.
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                store_s = pool.submit(store_explorer_series, stack, run_id, series=args.explorer_series,
                                      points=args.explorer_points).result()
            layout = api.put("/api/metric-explorer/layout/", json={"page": "run", "smoothing": 0, "panels": [
                {"pattern": EXPLORER_SERIES.format(index), "x_axis": "step"} for index in range(args.explorer_series)
            ]})
            layout.raise_for_status()
            explorer_loads = []
            for _ in range(args.explorer_repeats):
                page.goto(f"{base}/runs/{run_id}/")
                page.wait_for_function("() => window.tandemMetricExplorer && window.tandemMetricExplorer.drawnMs !== null",
                                       timeout=120_000)
                explorer_loads.append(page.evaluate("""(() => { const e = window.tandemMetricExplorer;
                    return {drawn_ms: e.drawnMs, started_ms: e.startedMs, panels: e.panels.filter((p) => p.plot).length,
                            points_per_panel: Math.max(...e.panels.map((p) => p.points[0]))}; })()"""))
            page.wait_for_function("() => document.querySelector('#run-connection').textContent === 'live'")
            page.evaluate("() => { window.tandemMetricExplorer.redrawMs = []; }")
            live_started = time.monotonic()
            first_live_step = args.explorer_points + 1
            for offset in range(args.explorer_live_steps):
                step = first_live_step + offset
                event = full_rl_step_event(run_id, step)
                event = event.model_copy(update={"emitted_at": time.time(), "algorithm_metrics": {
                    **event.algorithm_metrics,
                    **{f"bench_{index:02d}": explorer_value(index, step) for index in range(args.explorer_series)},
                }})
                trainer.post_events(run_id, [event])
                time.sleep(max(0.0, live_started + (offset + 1) * interval - time.monotonic()))
            # Every step reached the explorer; the frames after it hold the last redraws.
            page.wait_for_function(f"() => window.tandemMetricExplorer.liveSteps >= {args.explorer_live_steps}",
                                   timeout=30_000)
            page.wait_for_timeout(500)
            explorer_redraws = page.evaluate("window.tandemMetricExplorer.redrawMs")
            explorer_live_steps = page.evaluate("window.tandemMetricExplorer.liveSteps")

            # The workspace: 200 runs of 5 metrics, one of them live under a second trainer.
            api.post(f"/api/runs/{run_id}/cancel/").raise_for_status()
            live_run = api.post("/api/runs/", json={
                "project": credentials.project_id, "name": f"{WORKSPACE_NAME} 0", "environment": "calculator",
                "config": {"rl_steps": 1_000_000, "rl_learning_rate": WORKSPACE_RATES[0]},
            })
            live_run.raise_for_status()
            live_id = live_run.json()["id"]
            live_trainer = PlatformClient(base, credentials.trainer_token, trainer_name="bench-dashboard:2")
            claim_when_ready(live_trainer, live_id, stack=stack, timeout_s=180)
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                workspace_store_s = pool.submit(store_workspace_runs, stack, live_id, runs=args.workspace_runs,
                                                steps=args.workspace_steps).result()
            view = httpx.QueryParams({"q": WORKSPACE_NAME, "m": ",".join(WORKSPACE_METRICS),
                                      "g": "config.rl_learning_rate"})
            workspace_loads = []
            for _ in range(args.explorer_repeats):
                page.goto(f"{base}/projects/{credentials.project_id}/workspace/?{view}")
                page.wait_for_function("() => window.tandemWorkspace && window.tandemWorkspace.drawnMs !== null",
                                       timeout=120_000)
                workspace_loads.append(page.evaluate("""(() => { const w = window.tandemWorkspace;
                    const panels = Object.values(w.panels);
                    return {drawn_ms: w.drawnMs, panels: panels.length, runs: Math.min(...panels.map((p) => p.runs)),
                            buckets_per_run: Math.max(...panels.map((p) => p.points / p.runs)),
                            resolution: panels[0].resolution}; })()"""))
            page.wait_for_timeout(1000)  # the project's socket opens
            page.evaluate("() => { window.tandemWorkspace.redrawMs = []; }")
            live_started = time.monotonic()
            for offset in range(args.explorer_live_steps):
                event = full_rl_step_event(live_id, args.workspace_steps + 1 + offset)
                live_trainer.post_events(live_id, [event.model_copy(update={"emitted_at": time.time()})])
                time.sleep(max(0.0, live_started + (offset + 1) * interval - time.monotonic()))
            page.wait_for_function(f"() => window.tandemWorkspace.liveSteps >= {args.explorer_live_steps}",
                                   timeout=30_000)
            page.wait_for_timeout(500)
            workspace_redraws = page.evaluate("window.tandemWorkspace.redrawMs")
            workspace_live_steps = page.evaluate("window.tandemWorkspace.liveSteps")
            workspace_errors = page.evaluate("window.tandemWorkspace.errors")
            live_trainer.close()
            chromium_version = browser.version
            browser.close()
        trainer.close()
    finally:
        stack.stop()
    load_after = os.getloadavg()

    print(json.dumps({
        "metric_to_browser_p50_ms": round(statistics.median(latencies), 1),
        "metric_to_browser_p95_ms": round(percentile(latencies, 95), 1),
        "metric_to_browser_max_ms": round(max(latencies), 1),
        "metric_to_browser_under_500ms_p95": percentile(latencies, 95) < 500,
        "render_100k_points_ms": round(statistics.median(render["ms"]), 1),
        "render_under_1s": statistics.median(render["ms"]) < 1000,
        "explorer_50x100k_draw_ms": round(statistics.median(load["drawn_ms"] for load in explorer_loads), 1),
        "explorer_live_redraw_p95_ms": round(percentile(explorer_redraws, 95), 1),
        "explorer_draw_under_2s": statistics.median(load["drawn_ms"] for load in explorer_loads) <= 2000,
        "explorer_redraw_under_50ms_p95": percentile(explorer_redraws, 95) <= 50,
        "workspace_200_runs_draw_ms": round(statistics.median(load["drawn_ms"] for load in workspace_loads), 1),
        "workspace_live_redraw_p95_ms": round(percentile(workspace_redraws, 95), 1),
        "workspace_draw_under_2s": statistics.median(load["drawn_ms"] for load in workspace_loads) <= 2000,
        "workspace_redraw_under_50ms_p95": percentile(workspace_redraws, 95) <= 50,
        "details": {
            "events_measured": len(latencies),
            "events_missing": missing,
            "steps_per_s_posted": args.rate,
            "series_per_event": len(full_rl_step_event(run_id, 1).metric_values()),
            "page_redraws": redraws,
            "render_points": render["points"],
            "render_series": render["series"],
            "render_ms": [round(ms, 1) for ms in render["ms"]],
            "render_create_ms": round(render["create_ms"], 1),
            "explorer_panels": args.explorer_series,
            "explorer_points_per_series": args.explorer_points,
            "explorer_store_s": round(store_s, 1),
            "explorer_loads": [{key: round(value, 1) for key, value in load.items()} for load in explorer_loads],
            "explorer_redraws": len(explorer_redraws),
            "explorer_redraw_p50_ms": round(statistics.median(explorer_redraws), 1),
            "explorer_redraw_max_ms": round(max(explorer_redraws), 1),
            "explorer_live_steps_received": explorer_live_steps,
            "workspace_runs": args.workspace_runs,
            "workspace_metrics": list(WORKSPACE_METRICS),
            "workspace_steps_per_run": args.workspace_steps,
            "workspace_store_s": round(workspace_store_s, 1),
            "workspace_loads": [{key: round(value, 1) for key, value in load.items()} for load in workspace_loads],
            "workspace_redraws": len(workspace_redraws),
            "workspace_redraw_p50_ms": round(statistics.median(workspace_redraws), 1),
            "workspace_redraw_max_ms": round(max(workspace_redraws), 1),
            "workspace_live_steps_received": workspace_live_steps,
            "workspace_errors": workspace_errors,
            "page_errors": errors,
            "chromium": chromium_version,
            "cpus": os.cpu_count(),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in load_after],
            "git_commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT,
                                         capture_output=True, text=True).stdout.strip(),
        },
    }))


if __name__ == "__main__":
    main()
