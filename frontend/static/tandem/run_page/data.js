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
//
// The page's scripts, one per section, loaded in this order by runs/detail.html:
// data.js (this one: the page's state, the chart specs, the points stored), charts.js
// (drawing), status.js (the run's status and facts), evaluations.js (the Evaluations table),
// live.js (the REST backfill and the WebSocket, which start it all). They share
// window.tandemRunPageParts; what browser tests and the bench read is window.tandemRunPage.
(function () {
  "use strict";

  const root = document.getElementById("run-root");
  if (!root) return;

  // The run statuses this page tells apart: ended ones, as the contracts have them (window.tandemContracts),
  // and those in which it waits for its environment or a trainer (runs/pages.py RUN_PAGE_STATUSES).
  const TERMINAL = new Set(window.tandemContracts.run_statuses.terminal);
  const WAITING = new Set(JSON.parse(root.dataset.statuses).waiting);

  const { colour } = window.tandemCharts;

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
  });

  // Column-oriented data, as uPlot wants it: steps ascending, one array per stored series.
  const steps = [];
  const seenSteps = new Set();
  const columns = new Map();
  const names = new Set(); // every stored series name
  const undrawnSteps = [];

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
      found = rp.charts.filter((chart) => chart.spec.match(name));
      chartsOf.set(name, found);
    }
    return found;
  }
  const stored = (name) => chartsFor(name).length > 0 || CHARTS.some((spec) => spec.share_of === name);
  const isEvaluationSeries = (name) => chartsFor(name).some((chart) => chart.spec.source === "evaluations");
  const valueCounts = new Map(); // per stored series, its points that have a value

  // A series first seen: an empty column of `length` points in `into`; the charts that draw it re-lay out.
  function addSeries(name, into, length) {
    names.add(name);
    into.set(name, new Array(length).fill(null));
    valueCounts.set(name, 0);
    for (const chart of chartsFor(name)) chart.stale = true;
  }

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
    if (seenSteps.has(step)) {
      // The backfill and the socket can both bring a step, the backfill a part of it (read while
      // the step's points were being stored): the values it lacks are added, none counted twice.
      mergeStep(step, values);
      return;
    }
    seenSteps.add(step);
    let index = steps.length;
    if (index > 0 && steps[index - 1] > step) index = lowerBound(steps, step);
    for (const name of Object.keys(values)) {
      if (!names.has(name) && stored(name)) addSeries(name, columns, steps.length);
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
      if (values.policy_version !== undefined) rp.showRun({ policy_version: values.policy_version });
    }
    rp.scheduleRedraw();
  }

  function mergeStep(step, values) {
    const index = lowerBound(steps, step);
    let added = false;
    for (const [name, value] of Object.entries(values)) {
      if (value === undefined || value === null || !stored(name)) continue;
      if (!names.has(name)) addSeries(name, columns, steps.length);
      const column = columns.get(name);
      if (column[index] !== null) continue;
      column[index] = value;
      valueCounts.set(name, valueCounts.get(name) + 1);
      for (const chart of chartsFor(name)) page.chartPoints[chart.spec.id] += 1;
      page.pointCount += 1;
      added = true;
    }
    if (added) {
      undrawnSteps.push(step);
      rp.scheduleRedraw();
    }
  }

  // Set (or replace) the evaluation series' values at `step`; each (series, step) counts once.
  function ingestEvaluationPoints(step, values) {
    const index = lowerBound(evaluationSteps, step);
    if (evaluationSteps[index] !== step) {
      evaluationSteps.splice(index, 0, step);
      for (const column of evaluationColumns.values()) column.splice(index, 0, null);
    }
    for (const [name, value] of Object.entries(values)) {
      if (!evaluationColumns.has(name)) addSeries(name, evaluationColumns, evaluationSteps.length);
      const column = evaluationColumns.get(name);
      if (column[index] === null && value !== null) {
        valueCounts.set(name, valueCounts.get(name) + 1);
        page.pointCount += 1;
        for (const chart of chartsFor(name)) page.chartPoints[chart.spec.id] += 1;
      }
      column[index] = value;
    }
    undrawnSteps.push(step);
    rp.scheduleRedraw();
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

  const rp = (window.tandemRunPageParts = {
    root, TERMINAL, WAITING, CHARTS, el, page, metricsUrl, runUrl, websocketPath, evaluationsUrl, actionsByStatus,
    steps, columns, names, undrawnSteps, evaluationSteps, evaluationColumns, valueCounts,
    chartsFor, stored, isEvaluationSeries, ingestStep, ingestEvaluationPoints, lowerBound,
    // Set by the sections after this one.
    charts: [], scheduleRedraw: null, showRun: null,
  });
})();
