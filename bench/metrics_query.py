"""Chart queries of a run with a million points per series: buckets against the raw points.

Loads ``--points`` points of ``loss`` (one per step) plus ``reward_mean`` (every
4th step) and ``eval_success_rate`` (every 1000th) into a fresh PostgreSQL
database with COPY, then builds the chart buckets in bulk with
``metric_buckets_rebuild`` (the write path's statements, over every step). Then:

- ``chart_ms``: ``GET /api/runs/<id>/metrics/series/`` at 1000 points, in
  process through Django, DRF and token auth (``--queries`` times each, after
  one warm-up): ``full`` (``from_step=0&to_step=<last>``, ``loss``),
  ``full_all_series`` (no names, no bounds: every series, its extent looked up),
  ``recent`` (the last 1% of steps) and ``recent_raw`` (the last 1.5 x 1000
  steps, which come as raw points). ``p50``, ``p95``, the resolution and the
  buckets returned per series.
- ``naive_ms``: the raw points of the full range of ``loss`` (what a chart
  without buckets has to read; ``--naive-queries`` times), and
  ``naive_over_chart_p50`` = naive p50 / full chart p50.
- ``record_10_steps_ms``: ``metric_events_record`` of 10 more steps (11 series
  each) on top of the million, buckets included: the write path's cost.
- ``load_s``, ``rebuild_s``, row counts and table sizes.

The database is ``<DATABASE_URL's name>_metrics_bench``; it is dropped and
created again, and dropped at the end unless ``--keep-db``. Prints one JSON line.
Usage: ``DATABASE_URL=postgres://... python bench/metrics_query.py [--points N]``
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlparse, urlunparse

import psycopg

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO_ROOT), str(REPO_ROOT / "platform")]


def _bench_database_url(base_url: str) -> tuple[str, str, str]:
    """(bench database URL, its name, URL of the server's maintenance database)."""
    parsed = urlparse(base_url)
    if parsed.scheme not in ("postgres", "postgresql"):
        sys.exit(f"metrics_query needs DATABASE_URL to name a PostgreSQL database, got {base_url!r}")
    name = f"{parsed.path.lstrip('/') or 'tandem'}_metrics_bench"
    return (
        urlunparse(parsed._replace(path=f"/{name}")),
        name,
        urlunparse(parsed._replace(path="/postgres")),
    )


def _recreate_database(maintenance_url: str, name: str, *, drop_only: bool = False) -> None:
    with psycopg.connect(maintenance_url, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if not drop_only:
            connection.execute(f'CREATE DATABASE "{name}"')


def _percentiles(samples_s: list[float]) -> dict:
    ordered = sorted(samples_s)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return {
        "p50": round(statistics.median(ordered) * 1000, 2),
        "p95": round(p95 * 1000, 2),
        "n": len(ordered),
    }


def _copy_points(run_id: int, series: dict[str, range]) -> int:
    """COPY the points in chunks of text rows; returns how many."""
    from django.db import connection

    from telemetry.models import MetricPoint

    table = MetricPoint._meta.db_table
    total = 0
    with connection.cursor() as cursor:
        raw = cursor.cursor  # psycopg's own cursor, for COPY
        with raw.copy(f"COPY {table} (run_id, name, step, value, recorded_at) FROM STDIN") as copy:
            for name, steps in series.items():
                for chunk_start in range(0, len(steps), 100_000):
                    buffer = io.StringIO()
                    for step in steps[chunk_start : chunk_start + 100_000]:
                        # A noisy decaying curve: min, max and mean of a bucket all differ.
                        value = 1.0 / (1 + step * 1e-4) + ((step * 2654435761) % 1000) * 1e-5
                        buffer.write(f"{run_id}\t{name}\t{step}\t{value!r}\t2026-01-01 00:00:00+00\n")
                    copy.write(buffer.getvalue())
                total += len(steps)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=1_000_000, help="Points of the loss series.")
    parser.add_argument("--queries", type=int, default=20, help="Timed chart queries of each kind.")
    parser.add_argument("--naive-queries", type=int, default=5, help="Timed raw full-range reads.")
    parser.add_argument("--chart-points", type=int, default=1000, help="Points each chart asks.")
    parser.add_argument("--keep-db", action="store_true", help="Leave the bench database.")
    args = parser.parse_args()

    base_url = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/tandem")
    bench_url, bench_name, maintenance_url = _bench_database_url(base_url)
    _recreate_database(maintenance_url, bench_name)
    os.environ["DATABASE_URL"] = bench_url
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings.dev"
    os.environ["DJANGO_DEBUG"] = "0"  # no query log growing over a million-row load
    os.environ.setdefault("ALLOWED_HOSTS", "*")
    try:
        print(json.dumps(_bench(args)))
    finally:
        from django.db import connections

        connections.close_all()
        if not args.keep_db:
            _recreate_database(maintenance_url, bench_name, drop_only=True)


def _bench(args) -> dict:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, transaction
    from rest_framework.test import APIClient

    from accounts.services import project_create, user_create_with_token
    from environment_registry.builtin import CALCULATOR
    from environment_registry.services import environment_register
    from runs.services import run_create
    from tandem.contracts import TrainerStepEvent
    from telemetry.models import MetricBucket, MetricPoint
    from telemetry.services import metric_buckets_rebuild, metric_events_record

    call_command("migrate", verbosity=0)
    user, token = user_create_with_token(username="bench", password="bench")
    project = project_create(owner=user, name="bench")
    environment_register(user=user, project=project, spec=CALCULATOR)
    run = run_create(user=user, project=project, environment_name="calculator", config={}, name="")

    last_step = args.points - 1
    series = {
        "loss": range(args.points),
        "reward_mean": range(0, args.points, 4),
        "eval_success_rate": range(0, args.points, 1000),
    }
    started = time.perf_counter()
    with transaction.atomic():
        points_loaded = _copy_points(run.pk, series)
    load_s = time.perf_counter() - started
    started = time.perf_counter()
    buckets_written = metric_buckets_rebuild(run=run)
    rebuild_s = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")  # as autovacuum would after a load this size

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    url = f"/api/runs/{run.pk}/metrics/series/"
    charts = {
        "full": {"names": "loss", "from_step": 0, "to_step": last_step},
        "full_all_series": {},
        "recent": {"names": "loss", "from_step": args.points - args.points // 100,
                   "to_step": last_step},
        "recent_raw": {"names": "loss", "from_step": args.points - args.chart_points * 3 // 2,
                       "to_step": last_step},
    }
    chart_ms = {}
    for kind, params in charts.items():
        params = {**params, "points": args.chart_points}
        response = client.get(url, params)  # warm-up, and the shape of the answer
        assert response.status_code == 200, response.content
        answer = response.json()
        samples = []
        for _ in range(args.queries):
            started = time.perf_counter()
            response = client.get(url, params)
            response.json()
            samples.append(time.perf_counter() - started)
            assert response.status_code == 200
        chart_ms[kind] = {
            **_percentiles(samples),
            "resolution": answer["resolution"],
            "returned_per_series": {
                name: len(columns["mean"]) for name, columns in answer["series"].items()
            },
        }

    naive = []
    for _ in range(args.naive_queries):
        started = time.perf_counter()
        rows = list(
            MetricPoint.objects.filter(run=run, name="loss", step__gte=0, step__lte=last_step)
            .order_by("step")
            .values_list("step", "value")
        )
        naive.append(time.perf_counter() - started)
    assert len(rows) == args.points
    naive_ms = _percentiles(naive)

    writes = []
    for batch in range(5):
        events = [
            TrainerStepEvent(
                run_id=run.pk, step=args.points + batch * 10 + offset, phase="rl",
                policy_version=1, wall_s=1.0, wait_s=0.1, compute_s=0.7, publish_s=0.1,
                other_s=0.1, loss=0.5, reward_mean=0.1, success_rate=0.2, samples_per_s=3.0,
                staleness_mean=0.5, staleness_max=1.0, emitted_at=time.time(),
            )
            for offset in range(10)
        ]
        started = time.perf_counter()
        metric_events_record(run=run, events=events)
        writes.append(time.perf_counter() - started)

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_total_relation_size(%s), pg_total_relation_size(%s)",
            [MetricPoint._meta.db_table, MetricBucket._meta.db_table],
        )
        point_bytes, bucket_bytes = cursor.fetchone()
    return {
        "bench": "metrics_query",
        "points_loss_series": args.points,
        "points_loaded": points_loaded,
        "bucket_rows": MetricBucket.objects.filter(run=run).count(),
        "buckets_written_by_rebuild": buckets_written,
        "load_s": round(load_s, 2),
        "rebuild_s": round(rebuild_s, 2),
        "chart_points": args.chart_points,
        "chart_ms": chart_ms,
        "naive_ms": naive_ms,
        "naive_over_chart_p50": round(naive_ms["p50"] / chart_ms["full"]["p50"], 1),
        "chart_p95_under_200ms": all(kind["p95"] < 200 for kind in chart_ms.values()),
        "record_10_steps_ms": _percentiles(writes),
        "points_table_mb": round(point_bytes / 2**20, 1),
        "buckets_table_mb": round(bucket_bytes / 2**20, 1),
    }


if __name__ == "__main__":
    main()
