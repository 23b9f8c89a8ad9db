"""Series as files to download: CSV (one row per run and step, a column per series) and JSON.

What the metric explorer's download buttons and ``GET /api/runs/<id>/metrics/export/`` serve.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence

from rest_framework.renderers import BaseRenderer, JSONRenderer

from common.spreadsheet import spreadsheet_safe
from runs.models import Run

from .selectors import MetricTable

AXIS_COLUMNS = ("step", "rl_step", "wall_time_s", "samples_trained")


def metric_tables_csv(tables: Sequence[tuple[Run, MetricTable]]) -> str:
    """A header, then a row per run and step; a series a run lacks, or has no point at that step, is empty."""
    names = list(dict.fromkeys(name for _, table in tables for name in table.names))
    out = io.StringIO()
    writer = csv.writer(out)
    # Series names are the trainer's and environments' own: quoted where a spreadsheet would run them.
    writer.writerow([spreadsheet_safe(cell) for cell in ("run", "run_name", *AXIS_COLUMNS, *names)])
    for run, table in tables:
        for index, step in enumerate(table.steps):
            values = [table.values[name][index] if name in table.values else None for name in names]
            writer.writerow([spreadsheet_safe(cell) for cell in (
                run.pk, run.name, step, table.rl_step[index], table.wall_time_s[index],
                table.samples_trained[index], *("" if value is None else value for value in values),
            )])
    return out.getvalue()


def metric_table_json(run: Run, table: MetricTable) -> dict:
    """One run's series as parallel columns (``series[name][i]`` is at ``steps[i]``; null: no point)."""
    return {
        "run": run.pk,
        "name": run.name,
        "sft_steps": table.sft_steps,
        "names": table.names,
        "steps": table.steps,
        "rl_step": table.rl_step,
        "wall_time_s": table.wall_time_s,
        "samples_trained": table.samples_trained,
        "series": table.values,
    }


class CSVRenderer(BaseRenderer):
    """Lets ``?format=csv`` through DRF's content negotiation; the views answer CSV text themselves."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return data if isinstance(data, str) else json.dumps(data)


class CSVOrJSONDownload:
    """A download view's renderers: CSV or JSON by ``?format=``, and its errors JSON either way."""

    renderer_classes = [JSONRenderer, CSVRenderer]

    def handle_exception(self, exc):
        response = super().handle_exception(exc)
        # Every error of the API has one JSON shape, whatever format the download asked for.
        self.request.accepted_renderer, self.request.accepted_media_type = JSONRenderer(), JSONRenderer.media_type
        return response
