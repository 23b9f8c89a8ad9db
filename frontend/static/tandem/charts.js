// What the dashboard's charts share: the palette, whole-step axis ticks, y ranges and points
// that read true for constant series and single points, the one smoothing of a series,
// paging through a run's metric history (GET /api/runs/<id>/metrics/, by a step cursor),
// and (from socket.js) the one loop that keeps a WebSocket open, reconnecting with backoff.
// Loaded before the run page's scripts, run_compare.js, run_logs.js and metric_explorer.js,
// which find it at window.tandemCharts.
(function () {
  "use strict";

  const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];
  // Steps are whole: tick spacings 1, 2, 5, 10, 20, 50 ... never 0.25.
  const STEP_INCREMENTS = [0, 1, 2, 3, 4, 5, 6].flatMap((exponent) => [1, 2, 5].map((m) => m * 10 ** exponent));
  const METRICS_PAGE_LIMIT = 5000; // the API's largest page

  // A series colour as the platform gives it: an index into the palette, or a CSS colour.
  function colour(ref) {
    return typeof ref === "number" ? PALETTE[ref % PALETTE.length] : ref;
  }

  // A y scale's range (uPlot's `scales.y.range`). uPlot's own puts an all-zero series on a
  // 0 to 100 axis and a constant one at the edge of its axis: a constant gets room either side.
  function yRange(u, min, max) {
    if (min === null || max === null) return [0, 1];
    if (min === max) {
      const half = min === 0 ? 1 : Math.abs(min) / 10;
      return [min - half, max + half];
    }
    return uPlot.rangeNum(min, max, 0.1, true); // what uPlot does by default
  }

  // A series' `points.show`: lines alone, except where a series has one value, which no line
  // can draw. Stops counting at the second value, so long series cost two looks.
  function pointsWhenAlone(u, seriesIndex) {
    let values = 0;
    for (const value of u.data[seriesIndex]) {
      if (value !== null && value !== undefined && ++values > 1) return false;
    }
    return true;
  }

  // Every metric point after `afterStep`, page by page, until a page comes back empty.
  // `onPage(points, nextAfterStep)` sees each page as it arrives, so a caller can keep
  // its cursor even when a later page fails. `names`: only these metrics.
  async function metricPages(metricsUrl, { afterStep = -1, names = null, onPage }) {
    let cursor = afterStep;
    for (;;) {
      const query = new URLSearchParams({ after_step: String(cursor), limit: String(METRICS_PAGE_LIMIT) });
      if (names) query.set("names", names.join(","));
      const response = await fetch(`${metricsUrl}?${query}`, {
        credentials: "same-origin",
        headers: { Accept: "application/json" },
      });
      if (!response.ok) throw new Error(`metrics of ${metricsUrl}: HTTP ${response.status}`);
      const body = await response.json();
      if (body.points.length === 0) return cursor;
      cursor = body.next_after_step;
      onPage(body.points, cursor);
    }
  }

  // Exponential moving average, debiased as TensorBoard does so that the first points are not
  // pulled towards 0: every smoothing slider of the dashboard means this. Gaps stay gaps; a
  // weight of 0 gives the values back as they are.
  function smoothed(values, weight) {
    const out = new Array(values.length);
    let last = 0;
    let weightPower = 1;
    for (let i = 0; i < values.length; i++) {
      const value = values[i];
      if (value === null || value === undefined) {
        out[i] = null;
        continue;
      }
      last = last * weight + (1 - weight) * value;
      weightPower *= weight;
      out[i] = last / (1 - weightPower);
    }
    return out;
  }

  // The one socket loop (socket.js, loaded on every signed-in page).
  const runSocket = window.tandemSocket.runSocket;

  window.tandemCharts = { PALETTE, STEP_INCREMENTS, colour, metricPages, yRange, pointsWhenAlone, smoothed, runSocket };
})();
