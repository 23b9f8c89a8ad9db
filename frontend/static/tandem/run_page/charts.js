// The run page's charts (see data.js): each chart's uPlot series and data, smoothed as the
// dashboard smooths (charts.js), redrawn at most every REDRAW_INTERVAL_MS.
(function () {
  "use strict";

  const rp = window.tandemRunPageParts;
  if (!rp) return;
  const { CHARTS, el, page, steps, columns, names, undrawnSteps, evaluationSteps, evaluationColumns, valueCounts } = rp;
  const { STEP_INCREMENTS, yRange, pointsWhenAlone, smoothed } = window.tandemCharts;
  const REDRAW_INTERVAL_MS = 250; // at most 4 redraws a second
  const CHART_HEIGHT = 220;
  const DRAWN_AT_KEPT = 5000; // steps whose draw time is kept for window.tandemRunPage.drawnAt
  const drawnOrder = [];

  // --- series ----------------------------------------------------------------

  function faint(hex) {
    const rgb = [1, 3, 5].map((at) => parseInt(hex.slice(at, at + 2), 16));
    return `rgba(${rgb.join(", ")}, 0.28)`;
  }

  function format(value, percent) {
    if (percent && value !== null && value !== undefined) return `${(value * 100).toFixed(1)}%`;
    if (value === null || value === undefined) return "—";
    const magnitude = Math.abs(value);
    if (magnitude !== 0 && (magnitude >= 1e5 || magnitude < 1e-3)) return value.toExponential(2);
    return String(Number(value.toPrecision(4)));
  }

  // uPlot series and the data arrays that go with them, for one chart's layout.
  function uplotSeries(spec, layout) {
    const series = [{ label: "step" }];
    const raw = []; // indices of faint raw series, hidden from the legend
    for (const desc of layout) {
      const common = { scale: desc.scale || "y", spanGaps: true, points: { show: pointsWhenAlone } };
      if (spec.kind === "stacked") {
        series.push({
          ...common, label: desc.label, stroke: desc.color, fill: desc.color, width: 1,
          value: (u, v, seriesIndex, index) => format(
            index === null || !u.tandemShown ? null : u.tandemShown[seriesIndex - 1][index], spec.percent),
        });
      } else if (spec.smooth) {
        raw.push(series.length);
        series.push({ ...common, label: `${desc.label} (raw)`, stroke: faint(desc.color), width: 1 });
        series.push({
          ...common, label: desc.label, stroke: desc.color, width: 2, dash: desc.dash,
          // The legend shows the smoothed value and the raw one under the cursor.
          value: (u, v, seriesIndex, index) => index === null || v === null ? "—"
            : `${format(v)} (${format(u.data[seriesIndex - 1][index])})`,
        });
      } else {
        series.push({ ...common, label: desc.label, stroke: desc.color, width: 2, dash: desc.dash });
      }
    }
    return { series, raw };
  }

  // [steps, ...one array per uPlot series]; for stacked charts, also what the legend shows.
  function seriesData(spec, layout, stepColumn, columnOf, weight) {
    let raw = layout.map((desc) => columnOf(desc.name) || null);
    let totals = spec.share_of ? columnOf(spec.share_of) || null : null;
    // Only the steps that have one of the chart's series, so that an RL-only series
    // is not squeezed into the end of a long SFT phase.
    const keep = [];
    for (let i = 0; i < stepColumn.length; i++) {
      if (raw.some((column) => column !== null && column[i] !== null)) keep.push(i);
    }
    let xs = stepColumn;
    const pick = (column) => (column === null ? new Array(keep.length).fill(null) : keep.map((i) => column[i]));
    if (keep.length < stepColumn.length) {
      xs = keep.map((i) => stepColumn[i]);
      raw = raw.map(pick);
      if (totals !== null) totals = pick(totals);
    } else {
      raw = raw.map((column) => column || new Array(xs.length).fill(null));
    }
    if (spec.kind === "stacked") {
      const shown = totals === null ? raw
        : raw.map((column) => column.map((value, i) => (value === null || !totals[i] ? null : value / totals[i])));
      const running = new Array(xs.length).fill(0);
      const cumulative = shown.map((column) => column.map((value, i) => (running[i] += value || 0)));
      return { data: [xs, ...cumulative], shown };
    }
    const data = [xs];
    for (const column of raw) {
      if (spec.smooth) data.push(column, smoothed(column, weight));
      else data.push(column);
    }
    return { data, shown: null };
  }

  const compact = new Intl.NumberFormat("en", { notation: "compact", maximumFractionDigits: 1 });
  function tickValues(u, ticks) {
    return ticks.map((tick) => (Math.abs(tick) >= 1000 ? compact.format(tick) : String(Number(tick.toPrecision(6)))));
  }

  function plotOptions(spec, layout, width, hooks) {
    const { series, raw } = uplotSeries(spec, layout);
    // Areas and rates start at 0, so their sizes read true.
    const floor = spec.kind === "stacked" ? 0 : spec.range_min;
    // All at the floor (no error, no sample yet): a unit of room above it, not a sliver.
    const yScale = spec.range ? { range: spec.range }
      : floor !== undefined ? { range: (u, min, max) => (min === null ? [floor, 1]
        : max <= floor ? [Math.min(floor, min), floor + (spec.min_span || 1)]
          : [Math.min(floor, min), Math.max(max * 1.05, floor + (spec.min_span || 1e-3))]) }
        : { range: yRange };
    const scales = { x: { time: false }, y: yScale };
    const axes = [
      { label: "step", incrs: STEP_INCREMENTS },
      { scale: "y", values: spec.percent ? (u, ticks) => ticks.map((t) => `${Math.round(t * 100)}%`) : tickValues },
    ];
    // A series on a scale of its own gets an axis on the right.
    for (const scale of new Set(layout.map((desc) => desc.scale).filter((scale) => scale && scale !== "y"))) {
      scales[scale] = { range: yRange };
      axes.push({ scale, side: 1, grid: { show: false }, values: tickValues });
    }
    const bands = [];
    if (spec.kind === "stacked") {
      // Each area fills from the series below it up to its own top.
      for (let i = 2; i <= layout.length; i++) bands.push({ series: [i, i - 1] });
    }
    return {
      width, height: CHART_HEIGHT, scales, axes, series, bands,
      legend: { live: true },
      cursor: { sync: { key: "tandem-run" } },
      hooks: {
        init: [(u) => {
          // A raw series is drawn faint behind its smoothed one; the legend lists only the latter.
          const rows = u.root.querySelectorAll(".u-legend .u-series");
          for (const index of raw) if (rows[index]) rows[index].style.display = "none";
        }],
        // Hiding a smoothed series from the legend hides its raw companion too.
        setSeries: [(u, index) => {
          if (index !== null && raw.includes(index - 1) && u.series[index - 1].show !== u.series[index].show) {
            u.setSeries(index - 1, { show: u.series[index].show });
          }
        }],
        ...(hooks || {}),
      },
    };
  }

  // --- charts ------------------------------------------------------------------

  const charts = CHARTS.map((spec) => ({
    spec,
    container: document.getElementById(spec.id),
    empty: document.querySelector(`[data-empty-for="${spec.id}"]`),
    variant: spec.variant,
    layoutKey: null,
    layout: [],
    plot: null,
    stale: true,
  })).filter((chart) => chart.container);

  for (const select of document.querySelectorAll("select[data-chart-variant]")) {
    select.addEventListener("change", () => {
      const chart = charts.find((c) => c.spec.id === select.dataset.chartVariant);
      chart.variant = select.value;
      chart.stale = true;
      scheduleRedraw();
    });
  }

  if (el.smoothing) {
    el.smoothing.addEventListener("input", () => {
      page.smoothing = Number(el.smoothing.value);
      el.smoothingValue.textContent = page.smoothing.toFixed(2);
      scheduleRedraw();
    });
  }

  function chartWidth(container) {
    return Math.max(container.clientWidth, 300);
  }

  function drawChart(chart) {
    if (chart.stale) {
      chart.stale = false;
      const layout = chart.spec.layout(names, chart.variant);
      const key = layout.map((desc) => desc.name).join("|");
      if (key !== chart.layoutKey) {
        // A new environment or bucket: a new plot with a series for it.
        if (chart.plot) chart.plot.destroy();
        chart.plot = null;
        chart.layout = layout;
        chart.layoutKey = key;
        page.chartSeries[chart.spec.id] = layout.map((desc) => desc.label);
      }
    }
    const hasData = chart.layout.some((desc) => valueCounts.get(desc.name) > 0);
    if (chart.empty) chart.empty.hidden = hasData;
    if (!hasData) return;
    const [stepColumn, columnOf] = chart.spec.source === "evaluations"
      ? [evaluationSteps, (name) => evaluationColumns.get(name)]
      : [steps, (name) => columns.get(name)];
    const { data, shown } = seriesData(chart.spec, chart.layout, stepColumn, columnOf, page.smoothing);
    page.chartSteps[chart.spec.id] = data[0].length;
    if (!chart.plot) {
      // uPlot sets its scales as it draws, after a microtask when the plot is new.
      const recordYRange = (u) => {
        page.chartYRange[chart.spec.id] = [u.scales.y.min, u.scales.y.max];
      };
      chart.plot = new uPlot(plotOptions(chart.spec, chart.layout, chartWidth(chart.container), { draw: [recordYRange] }),
        data, chart.container);
      chart.plot.tandemShown = shown;
      chart.plot.over.addEventListener("mouseleave", () => showNewest(chart.plot));
    } else {
      chart.plot.tandemShown = shown;
      // batch(): draw now, not in a microtask, so that drawnAt is stamped after the drawing.
      chart.plot.batch((u) => u.setData(data));
    }
    showNewest(chart.plot);
  }

  // With the cursor away from a chart, its legend shows the newest values.
  function showNewest(u) {
    if (u.cursor.left === undefined || u.cursor.left < 0) u.setLegend({ idx: u.data[0].length - 1 });
  }

  let redrawTimer = null;
  let lastRedraw = -Infinity;
  function scheduleRedraw() {
    if (redrawTimer !== null) return;
    const wait = Math.max(0, lastRedraw + REDRAW_INTERVAL_MS - performance.now());
    redrawTimer = setTimeout(() => requestAnimationFrame(redraw), wait);
  }

  function redraw() {
    redrawTimer = null;
    const redrawnAt = performance.now();
    if (lastRedraw !== -Infinity) {
      page.shortestRedrawGapMs = Math.min(page.shortestRedrawGapMs ?? Infinity, redrawnAt - lastRedraw);
    }
    lastRedraw = redrawnAt;
    const drawing = undrawnSteps.splice(0);
    for (const chart of charts) drawChart(chart);
    page.redraws += 1;
    const now = Date.now();
    for (const step of drawing) {
      if (page.drawnAt[step] !== undefined) continue;
      page.drawnAt[step] = now;
      drawnOrder.push(step);
    }
    while (drawnOrder.length > DRAWN_AT_KEPT) delete page.drawnAt[drawnOrder.shift()];
  }

  window.addEventListener("resize", () => {
    for (const { container, plot } of charts) {
      if (plot) plot.setSize({ width: chartWidth(container), height: CHART_HEIGHT });
    }
  });

  // For bench/dashboard.py: draw a chart of `points` steps (the reward chart's
  // series: two metrics, each raw and smoothed) and time setData through the
  // end of uPlot's drawing, `repeats` times on fresh data.
  async function timeRender(points, repeats = 5) {
    const spec = CHARTS[0];
    const layout = spec.layout(new Set());
    const host = document.createElement("figure");
    host.className = "card chart-card";
    const container = document.createElement("div");
    container.className = "chart";
    host.appendChild(container);
    document.querySelector(".charts").appendChild(host);
    const stepColumn = Array.from({ length: points }, (_, i) => i + 1);
    const synthetic = (phase) => new Map(layout.map((desc, k) => [desc.name, stepColumn.map(
      (step) => Math.sin(step / 500 + phase + k) * 0.4 + 0.5 + Math.random() * 0.1)]));
    const createStart = performance.now();
    const first = synthetic(0);
    const plot = new uPlot(
      plotOptions(spec, layout, chartWidth(container)),
      seriesData(spec, layout, stepColumn, (name) => first.get(name), page.smoothing).data,
      container,
    );
    const createMs = performance.now() - createStart;
    const ms = [];
    for (let r = 1; r <= repeats; r++) {
      const fresh = synthetic(r);
      await new Promise((resolve) => requestAnimationFrame(resolve));
      const start = performance.now();
      const { data } = seriesData(spec, layout, stepColumn, (name) => fresh.get(name), page.smoothing);
      plot.batch((u) => u.setData(data));
      ms.push(performance.now() - start);
    }
    plot.destroy();
    host.remove();
    return { points, series: layout.length * 2, create_ms: createMs, ms };
  }

  page.timeRender = timeRender; // (points, repeats) -> how long a chart takes to draw that many points
  Object.assign(rp, { charts, scheduleRedraw });
})();
