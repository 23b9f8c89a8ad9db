// Live charts of one run.
//
// History comes from the REST API, paged by a step cursor; the WebSocket only
// tells us about new steps and may drop messages. So: backfill, open the
// socket, and on every (re)connect backfill again from the REST cursor. Steps
// already drawn are skipped, so overlap between the two is harmless.
//
// Points are stored as they arrive; charts are redrawn at most every
// REDRAW_INTERVAL_MS, however many messages came in between.
//
// A held-out evaluation arrives as one message: its row is upserted in the
// Evaluations table, and the metrics of the run's environment join the
// evaluation chart's points.
//
// Which charts there are, and which series each one draws, is the platform's
// (telemetry/charts.py), given to the page as data: the charts' code knows no metric name.
(function () {
  "use strict";

  const root = document.getElementById("run-root");
  if (!root) return;

  // The run statuses this page tells apart, as the platform's vocabulary has them (runs/pages.py).
  const STATUSES = JSON.parse(root.dataset.statuses);
  const TERMINAL = new Set(STATUSES.terminal);
  const WAITING = new Set(STATUSES.waiting);
  const RETRY_MIN_MS = 1000;
  const RETRY_MAX_MS = 15000;
  const REDRAW_INTERVAL_MS = 250; // at most 4 redraws a second
  const CHART_HEIGHT = 220;
  const DRAWN_AT_KEPT = 5000; // steps whose draw time is kept for window.tandemRunPage.drawnAt
  // The series of the run's evaluations, as evaluations.services.evaluation_series_name names them:
  // eval/<metric> for its own environment's, eval/<name@version>/<metric> for another environment's,
  // eval/dataset:<name@version>/<metric> for a dataset's; a label past 32 characters is cut with a
  // hash, which the platform sends as series_label.
  const EVALUATION_SERIES_PREFIX = "eval/";
  function evaluationSeriesPrefix(evaluation) {
    if (evaluation.kind === "dataset" || evaluation.environment !== root.dataset.environmentLabel) {
      return `${EVALUATION_SERIES_PREFIX}${evaluation.series_label}/`;
    }
    return EVALUATION_SERIES_PREFIX;
  }

  const { STEP_INCREMENTS, colour, metricPages, yRange, pointsWhenAlone } = window.tandemCharts;

  // What each chart draws. `match` picks the series it stores and counts; `layout`
  // turns the names seen so far into its series, so environments and buckets
  // that appear later get series of their own.
  const CHARTS = JSON.parse(document.getElementById("run-charts").textContent).map(chartSpec);

  function chartSpec(definition) {
    const fixed = definition.series || [];
    const fixedNames = new Set(fixed.map((series) => series.name));
    const family = definition.family ? { ...definition.family, regex: new RegExp(definition.family.pattern) } : null;
    return {
      ...definition,
      variant: definition.variants ? definition.variants[0][0] : undefined,
      match: (name) => fixedNames.has(name) || (family !== null && family.regex.test(name)),
      layout: (names, variant) => [
        ...fixed.filter((series) => !series.optional || names.has(series.name)).map((series) => ({
          name: series.name, label: series.label, color: colour(series.colour), scale: series.scale,
        })),
        ...(family ? familySeries(family, names, variant) : []),
      ],
    };
  }

  // A bucket "4+" sorts after bucket 4.
  function orderOf(order) {
    if (order === undefined) return 0;
    return Number(order.replace(/\+$/, "")) + (order.endsWith("+") ? 0.5 : 0);
  }

  // The series of a family among the names seen: by environment (name order), then by order.
  function familySeries(family, names, variant) {
    const found = [];
    for (const name of names) {
      const match = family.regex.exec(name);
      if (!match) continue;
      const groups = match.groups || {};
      if (groups.variant !== undefined && groups.variant !== variant) continue;
      found.push({ name, groups, environment: groups.environment || "", order: orderOf(groups.order) });
    }
    found.sort((a, b) => (a.environment < b.environment ? -1 : a.environment > b.environment ? 1 : a.order - b.order));
    return found.map(({ name, groups }, index) => ({
      name,
      // "1 version", "2 versions": a family may name its label for an order of exactly 1.
      label: (groups.order === "1" && family.label_one ? family.label_one : family.label)
        .replace(/\{(\w+)\}/g, (_, key) => groups[key] ?? ""),
      color: family.colour === "environment" ? environmentColor(groups.environment)
        : family.colour === "gradient"
          ? `hsl(${Math.round(140 - (140 * index) / Math.max(found.length - 1, 1))}, 65%, 50%)`
          : colour(family.colour),
      dash: family.dash ? family.dash[groups.order] : undefined,
    }));
  }

  // Each environment keeps one colour across charts.
  const environmentColors = new Map();
  function environmentColor(environment) {
    if (!environmentColors.has(environment)) {
      environmentColors.set(environment, colour(environmentColors.size));
    }
    return environmentColors.get(environment);
  }

  const metricsUrl = root.dataset.metricsUrl;
  const runUrl = root.dataset.runUrl;
  const websocketPath = root.dataset.websocketPath;
  const evaluationsUrl = root.dataset.evaluationsUrl;
  const actionsByStatus = JSON.parse(root.dataset.actions || "{}");
  const el = {
    status: document.getElementById("run-status"),
    statusReason: document.getElementById("run-status-reason"),
    stalled: document.getElementById("run-stalled"),
    stalledSince: document.getElementById("run-stalled-since"),
    step: document.getElementById("run-step"),
    policyVersion: document.getElementById("run-policy-version"),
    connection: document.getElementById("run-connection"),
    cancelForm: document.getElementById("cancel-form"),
    smoothing: document.getElementById("chart-smoothing"),
    smoothingValue: document.getElementById("chart-smoothing-value"),
  };

  // What browser tests, the dashboard bench and curious people in the console can read.
  const page = (window.tandemRunPage = {
    pointCount: 0, // points of charted series received, over REST and WebSocket, each counted once
    lastStep: -1, // highest step received
    policyVersion: -1, // newest policy version shown
    status: root.dataset.status,
    reconnects: 0,
    socket: null,
    chartPoints: Object.fromEntries(CHARTS.map((spec) => [spec.id, 0])), // values each chart received
    chartSeries: {}, // chart id -> labels of the series it draws now
    idleRefreshes: 0, // times the idle sentence was read again
    chartSteps: {}, // chart id -> how many steps it draws now
    chartYRange: {}, // chart id -> [min, max] of its left axis now
    redraws: 0, // coalesced: far fewer than messages when steps arrive quickly
    drawnAt: {}, // step -> Date.now() when the charts first drew it (the newest DRAWN_AT_KEPT steps)
    smoothing: el.smoothing ? Number(el.smoothing.value) : 0,
    timeRender, // (points, repeats) -> how long a chart takes to draw that many points
  });

  // Column-oriented data, as uPlot wants it: steps ascending, one array per stored series.
  const steps = [];
  const seenSteps = new Set();
  const columns = new Map();
  const names = new Set(); // every stored series name
  const undrawnSteps = [];
  const drawnOrder = [];
  let restCursor = -1; // last step the REST API returned: everything up to it is drawn

  // The evaluation chart's points (its spec's source is "evaluations") are apart from the
  // trainer's steps: an evaluation is recorded at its policy version's step, often after the
  // trainer sent later steps, and a retried one replaces its values.
  const evaluationSteps = [];
  const evaluationColumns = new Map();

  // Per series name, the charts that draw it (memoised: names repeat at every step).
  const chartsOf = new Map();
  function chartsFor(name) {
    let found = chartsOf.get(name);
    if (found === undefined) {
      found = charts.filter((chart) => chart.spec.match(name));
      chartsOf.set(name, found);
    }
    return found;
  }
  const stored = (name) => chartsFor(name).length > 0 || CHARTS.some((spec) => spec.share_of === name);
  const isEvaluationSeries = (name) => chartsFor(name).some((chart) => chart.spec.source === "evaluations");
  const valueCounts = new Map(); // per stored series, its points that have a value

  function ingestStep(step, values) {
    // A REST page holds the evaluation series too, at the steps they were recorded at.
    const evaluationValues = {};
    for (const name of Object.keys(values)) {
      if (isEvaluationSeries(name)) evaluationValues[name] = values[name];
    }
    if (Object.keys(evaluationValues).length > 0) {
      ingestEvaluationPoints(step, evaluationValues);
      values = { ...values };
      for (const name of Object.keys(evaluationValues)) delete values[name];
      // Evaluations move neither the trainer's step nor its version on screen.
      if (Object.keys(values).length === 0) return;
    }
    if (seenSteps.has(step)) return;
    seenSteps.add(step);
    let index = steps.length;
    if (index > 0 && steps[index - 1] > step) index = lowerBound(steps, step);
    for (const name of Object.keys(values)) {
      if (!names.has(name) && stored(name)) {
        names.add(name);
        columns.set(name, new Array(steps.length).fill(null));
        valueCounts.set(name, 0);
        for (const chart of chartsFor(name)) chart.stale = true;
      }
    }
    steps.splice(index, 0, step);
    for (const [name, column] of columns) {
      const value = values[name];
      column.splice(index, 0, value === undefined ? null : value);
      if (value !== undefined && value !== null) valueCounts.set(name, valueCounts.get(name) + 1);
    }
    for (const name in values) {
      for (const chart of chartsFor(name)) page.chartPoints[chart.spec.id] += 1;
    }
    page.pointCount += Object.keys(values).filter(stored).length; // what the backfill reads too
    undrawnSteps.push(step);
    if (step > page.lastStep) {
      page.lastStep = step;
      el.step.textContent = String(step);
      // Points that arrive by backfill (not the socket) carry the version too.
      if (values.policy_version !== undefined) showRun({ policy_version: values.policy_version });
    }
    scheduleRedraw();
  }

  // Set (or replace) the evaluation series' values at `step`; each (series, step) counts once.
  function ingestEvaluationPoints(step, values) {
    const index = lowerBound(evaluationSteps, step);
    if (evaluationSteps[index] !== step) {
      evaluationSteps.splice(index, 0, step);
      for (const column of evaluationColumns.values()) column.splice(index, 0, null);
    }
    for (const [name, value] of Object.entries(values)) {
      if (!evaluationColumns.has(name)) {
        names.add(name);
        evaluationColumns.set(name, new Array(evaluationSteps.length).fill(null));
        valueCounts.set(name, 0);
        for (const chart of chartsFor(name)) chart.stale = true;
      }
      const column = evaluationColumns.get(name);
      if (column[index] === null && value !== null) {
        valueCounts.set(name, valueCounts.get(name) + 1);
        page.pointCount += 1;
        for (const chart of chartsFor(name)) page.chartPoints[chart.spec.id] += 1;
      }
      column[index] = value;
    }
    undrawnSteps.push(step);
    scheduleRedraw();
  }

  function lowerBound(sorted, value) {
    let low = 0;
    let high = sorted.length;
    while (low < high) {
      const mid = (low + high) >> 1;
      if (sorted[mid] < value) low = mid + 1;
      else high = mid;
    }
    return low;
  }

  // --- series ----------------------------------------------------------------

  // Exponential moving average, debiased as TensorBoard does so that the first
  // points are not pulled towards 0. Gaps stay gaps.
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
    lastRedraw = performance.now();
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

  // --- status -------------------------------------------------------------

  function showRun(update) {
    // An ended run does not come back to life because of a stale REST answer.
    const ended = TERMINAL.has(page.status) && !TERMINAL.has(update.status);
    if (update.status && update.status !== page.status && !ended) {
      page.status = update.status;
      el.status.textContent = update.status;
      el.status.className = `badge badge-${update.status}`;
      if (TERMINAL.has(update.status) && el.cancelForm) el.cancelForm.remove();
      if (TERMINAL.has(update.status)) showRunEnded();
      // A claimed run's environment passed its probe: the wait is over.
      const waiting = document.getElementById("run-environment-reason");
      if (waiting && !WAITING.has(update.status)) waiting.remove();
      // Only the actions the new status admits stay on offer (the server decided per status).
      const offered = actionsByStatus[update.status] || [];
      for (const form of document.querySelectorAll("#run-actions form[data-action]")) {
        form.hidden = !offered.includes(form.dataset.action);
      }
    }
    if (update.status_reason !== undefined) el.statusReason.textContent = update.status_reason;
    // The progress watchdog's flag: set while the step stands still, null once it advances.
    if (update.stalled_since !== undefined) {
      el.stalled.hidden = update.stalled_since === null;
      if (update.stalled_since !== null) {
        el.stalledSince.dateTime = update.stalled_since;
        el.stalledSince.textContent = update.stalled_since.replace("T", " ").slice(0, 19);
      }
    }
    // Versions only grow: a REST answer that left before a socket message must not
    // put an older version back on screen.
    const version = update.policy_version;
    if (version !== undefined && version !== null && !(version < page.policyVersion)) {
      page.policyVersion = version;
      el.policyVersion.textContent = String(version);
    }
  }

  function showConnection(text) {
    if (TERMINAL.has(page.status)) showRunEnded();
    else el.connection.textContent = text;
  }

  // An ended run sends nothing more: an open socket is no reason to say "live" (runs/detail.html says the same).
  function showRunEnded() {
    el.connection.textContent = `none, the run has ended (${page.status})`;
  }

  async function refreshRun() {
    const response = await fetch(runUrl, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (response.ok) showRun(await response.json());
  }

  // --- evaluations -------------------------------------------------------------

  // The table's metric columns as runs/pages.py (_evaluation_table) orders and labels them:
  // success rate and mean reward, a column per pass@k by k, then a dataset's held-out metrics
  // (tandem.contracts.DATASET_EVALUATION_METRICS), each only once some evaluation has it.
  const EVALUATION_LEADING_METRICS = ["success_rate", "mean_reward"];
  const PASS_AT_K = /^pass@(\d+)$/;
  const DATASET_EVALUATION_METRICS = ["loss", "perplexity", "token_accuracy"];
  const EVALUATION_FIXED_COLUMNS = ["#", "Step", "Policy version", "Environment", "Status", "Episodes"];

  function evaluationColumnLabel(name) {
    if (name === "success_rate") return "Success rate";
    if (name === "mean_reward") return "Mean reward";
    if (DATASET_EVALUATION_METRICS.includes(name)) return `Held-out ${name.replaceAll("_", " ")}`;
    return name;
  }

  // Where a metric's column goes: [group, position in it]; null for a metric the table leaves out.
  function evaluationColumnOrder(name) {
    if (EVALUATION_LEADING_METRICS.includes(name)) return [0, EVALUATION_LEADING_METRICS.indexOf(name)];
    const passAtK = PASS_AT_K.exec(name);
    if (passAtK) return [1, Number(passAtK[1])];
    if (DATASET_EVALUATION_METRICS.includes(name)) return [2, DATASET_EVALUATION_METRICS.indexOf(name)];
    return null;
  }

  // The sentence of what the trainer waited on, asked again at most every IDLE_REFRESH_MS while steps come.
  const IDLE_REFRESH_MS = 5000;
  let idleRefreshDue = null;
  let idleRefreshAgain = false; // a step came while a read was due or under way: read once more after it
  function refreshIdle() {
    const idle = document.getElementById("run-idle");
    if (!idle) return;
    if (idleRefreshDue !== null) {
      idleRefreshAgain = true;
      return;
    }
    idleRefreshDue = setTimeout(async () => {
      try {
        const response = await fetch(idle.dataset.idleUrl, { credentials: "same-origin" });
        if (!response.ok) return;
        const summary = (await response.json()).idle;
        idle.textContent = summary ? summary.sentence : "";
        idle.hidden = !summary;
        page.idleRefreshes += 1;
      } catch (error) {
        console.warn("the idle summary could not be read", error);
      } finally {
        idleRefreshDue = null;
        if (idleRefreshAgain) {
          idleRefreshAgain = false;
          refreshIdle();
        }
      }
    }, page.idleRefreshes === 0 ? 0 : IDLE_REFRESH_MS);
  }

  function showEvaluation(evaluation) {
    upsertEvaluationRow(evaluation);
    const values = {};
    for (const [metric, value] of Object.entries(evaluation.metrics)) {
      const name = `${evaluationSeriesPrefix(evaluation)}${metric}`;
      if (isEvaluationSeries(name)) values[name] = value;
    }
    if (Object.keys(values).length > 0) ingestEvaluationPoints(evaluation.step, values);
  }

  function evaluationTable() {
    const existing = document.getElementById("evaluations-table");
    if (existing) return existing;
    // The first evaluation of the page's life: the section runs/_evaluations.html would have drawn.
    const section = document.createElement("section");
    section.className = "card";
    section.id = "evaluations";
    const heading = document.createElement("h2");
    heading.textContent = "Evaluations";
    const note = document.createElement("p");
    note.className = "muted";
    note.textContent = "Held-out tasks, never trained on. In brackets: the 95% interval, where the metric has one.";
    const table = document.createElement("table");
    table.id = "evaluations-table";
    table.className = "runs";
    const headRow = table.createTHead().insertRow();
    for (const label of [...EVALUATION_FIXED_COLUMNS, ...EVALUATION_LEADING_METRICS.map(evaluationColumnLabel)]) {
      headRow.appendChild(document.createElement("th")).textContent = label;
    }
    table.createTBody();
    section.append(heading, note, table);
    document.querySelector("section.charts").after(section);
    return table;
  }

  // Gives the table a column for each metric of `metrics` it shows and lacks, in order, with
  // "—" in the rows before; returns the table's metric columns by name.
  function addEvaluationColumns(table, metrics) {
    const header = table.tHead.rows[0];
    const labels = [...header.cells].slice(EVALUATION_FIXED_COLUMNS.length).map((cell) => cell.textContent);
    const known = [...EVALUATION_LEADING_METRICS, ...Object.keys(metrics), ...DATASET_EVALUATION_METRICS];
    const nameOf = new Map(known.map((name) => [evaluationColumnLabel(name), name]));
    const shown = labels.map((label) => nameOf.get(label) ?? label);
    const before = (a, b) => {
      const [orderA, orderB] = [evaluationColumnOrder(a), evaluationColumnOrder(b)];
      if (orderA === null || orderB === null) return false; // one the page drew and this script does not know
      return orderA[0] < orderB[0] || (orderA[0] === orderB[0] && orderA[1] < orderB[1]);
    };
    for (const name of Object.keys(metrics)) {
      if (evaluationColumnOrder(name) === null || shown.includes(name)) continue;
      let position = shown.findIndex((other) => before(name, other));
      if (position === -1) position = shown.length;
      shown.splice(position, 0, name);
      const at = EVALUATION_FIXED_COLUMNS.length + position;
      header.insertBefore(document.createElement("th"), header.cells[at] || null).textContent =
        evaluationColumnLabel(name);
      for (const row of table.tBodies[0].rows) row.insertBefore(metricCell(null, null), row.cells[at] || null);
    }
    return shown;
  }

  // A metric's cell as evaluations/_metric_value.html draws it: value and, where it has one, its interval.
  function metricCell(value, interval) {
    const cell = document.createElement("td");
    if (value === undefined || value === null) {
      cell.textContent = "—";
      return cell;
    }
    cell.textContent = value.toFixed(3);
    if (interval) {
      const bounds = document.createElement("span");
      bounds.className = "muted small";
      bounds.textContent = `[${interval[0].toFixed(3)}, ${interval[1].toFixed(3)}]`;
      cell.append(" ", bounds);
    }
    return cell;
  }

  function evaluationRow(evaluation, columns) {
    const row = document.createElement("tr");
    row.dataset.evaluation = String(evaluation.index);
    row.dataset.kind = evaluation.kind;
    row.dataset.environment = evaluation.environment;
    const text = (value) => {
      row.insertCell().textContent = String(value);
    };
    text(evaluation.index);
    text(evaluation.step);
    text(evaluation.policy_version);
    // As Evaluation.target_label has it.
    text(evaluation.kind === "dataset" ? `dataset ${evaluation.environment}` : evaluation.environment);
    const status = row.insertCell();
    const badge = status.appendChild(document.createElement("span"));
    badge.className = `badge badge-evaluation-${evaluation.status}`;
    badge.textContent = evaluation.status;
    if (evaluation.reason) {
      const reason = document.createElement("span");
      reason.className = "muted small";
      reason.textContent = evaluation.reason;
      status.append(" ", reason);
    }
    text(evaluation.episodes);
    for (const name of columns) row.appendChild(metricCell(evaluation.metrics[name], evaluation.intervals[name]));
    return row;
  }

  // A row per (index, kind, environment), in that order, the environment's before the datasets':
  // a retried evaluation replaces its row.
  function upsertEvaluationRow(evaluation) {
    const table = evaluationTable();
    const columns = addEvaluationColumns(table, evaluation.metrics);
    const row = evaluationRow(evaluation, columns);
    const key = (dataset) => [Number(dataset.evaluation), dataset.kind === "dataset" ? 1 : 0, dataset.environment];
    const compare = (a, b) => {
      for (let i = 0; i < a.length; i++) {
        if (a[i] !== b[i]) return a[i] < b[i] ? -1 : 1;
      }
      return 0;
    };
    const own = key(row.dataset);
    const rows = [...table.tBodies[0].rows];
    const same = rows.find((other) => compare(key(other.dataset), own) === 0);
    if (same) same.replaceWith(row);
    else table.tBodies[0].insertBefore(row, rows.find((other) => compare(key(other.dataset), own) > 0) || null);
  }

  // Every evaluation of the run, page by page (GET /api/runs/<id>/evaluations/): after a
  // reconnect, for those whose message the socket dropped while it was down.
  async function backfillEvaluations() {
    let url = `${evaluationsUrl}?page_size=200`;
    while (url) {
      const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (!response.ok) throw new Error(`evaluations of ${evaluationsUrl}: HTTP ${response.status}`);
      const body = await response.json();
      for (const evaluation of body.results) showEvaluation(evaluation);
      url = body.next;
    }
  }

  // --- REST backfill ------------------------------------------------------

  let backfilling = null;
  let backfillAgain = false;

  // Drain the REST API from the cursor; a call during a drain runs one more after it,
  // so a reconnect's backfill always starts after the socket is subscribed.
  function backfill() {
    if (backfilling) {
      backfillAgain = true;
      return backfilling;
    }
    backfilling = (async () => {
      do {
        backfillAgain = false;
        await drainMetrics();
      } while (backfillAgain);
    })().finally(() => {
      backfilling = null;
    });
    return backfilling;
  }

  // The series the charts draw, of those the run logged. A run also logs series only the metric
  // explorer shows (it reads them bucketed): paging through their raw points here would read
  // millions of them on a long run, to keep none.
  async function chartedNames() {
    const response = await fetch(`${metricsUrl}names/`, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (!response.ok) throw new Error(`series names of ${metricsUrl}: HTTP ${response.status}`);
    return (await response.json()).names.filter(stored);
  }

  async function drainMetrics() {
    const names = await chartedNames();
    if (names.length === 0) return; // nothing charted logged yet; the socket brings the first steps
    await metricPages(metricsUrl, {
      afterStep: restCursor,
      names,
      onPage: (points, nextAfterStep) => {
        let step = null;
        let values = {};
        for (const point of points) {
          if (point.step !== step) {
            if (step !== null) ingestStep(step, values);
            step = point.step;
            values = {};
          }
          values[point.name] = point.value;
        }
        ingestStep(step, values);
        restCursor = nextAfterStep;
      },
    });
  }

  // --- WebSocket ----------------------------------------------------------

  let retryMs = RETRY_MIN_MS;
  let openedBefore = false; // the first open follows the page's render: its evaluations are on it

  function connect() {
    const scheme = window.location.protocol === "https:" ? "wss:" : "ws:";
    const socket = new WebSocket(`${scheme}//${window.location.host}${websocketPath}`);
    page.socket = socket;

    socket.addEventListener("open", () => {
      retryMs = RETRY_MIN_MS;
      showConnection("live");
      // Catch up on what happened while we were not subscribed.
      backfill().catch(console.error);
      refreshRun().catch(console.error);
      if (openedBefore) {
        backfillEvaluations().catch(console.error);
        window.dispatchEvent(new CustomEvent("tandem:run-reconnected")); // messages may have been dropped
      }
      openedBefore = true;
    });

    socket.addEventListener("message", (event) => {
      const message = JSON.parse(event.data);
      if (message.type === "metrics") {
        ingestStep(message.step, message.values);
        // The metric explorer's panels follow the run on this socket rather than a second one of their own.
        window.dispatchEvent(new CustomEvent("tandem:run-metrics", { detail: { step: message.step, values: message.values } }));
        showRun({ status: message.status, policy_version: message.policy_version });
        refreshIdle();
      } else if (message.type === "status") {
        showRun(message);
      } else if (message.type === "evaluation") {
        showEvaluation(message);
      }
    });

    socket.addEventListener("close", () => {
      if (page.socket !== socket) return;
      page.socket = null;
      if (TERMINAL.has(page.status)) {
        showRunEnded();
        backfill().catch(console.error);
        return;
      }
      showConnection(`reconnecting in ${Math.round(retryMs / 1000)} s…`);
      const delay = retryMs * (0.75 + Math.random() / 2);
      retryMs = Math.min(retryMs * 2, RETRY_MAX_MS);
      setTimeout(() => {
        page.reconnects += 1;
        connect();
      }, delay);
    });
  }

  scheduleRedraw(); // the empty charts' placeholders, before any point arrives
  backfill()
    .catch(console.error)
    .finally(connect);
})();
