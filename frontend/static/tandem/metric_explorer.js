// The metric explorer: panels of any logged series, found by name or glob, on the run page and in
// comparison (runs/_metric_explorer.html). Each panel has its x-axis (RL step, trainer step, wall
// time, samples trained), log scale, y-range, reset zoom, the SFT → RL boundary, and its downloads.
//
// On the step axes (trainer step, RL step) a panel reads its series bucketed (GET .../metrics/series/,
// about one bucket per pixel of its width, each drawn at its mean), so a series of 100,000 points costs
// what one of a thousand does. On the run page the panels then follow the run live: each "metrics"
// message of the page's WebSocket (run_page/live.js passes it on as a "tandem:run-metrics" event) joins the
// newest bucket of the series it names, and the panels it changed are redrawn once per animation frame.
// The other x-axes (wall time, samples trained) are sums over every step that only the export endpoint
// (GET /api/runs/<id>/metrics/export/?names=<glob>) computes: those panels read it, raw, and stay still.
// The layout (panels, their options, the smoothing) is the user's, saved over the API at each change.
(function () {
  "use strict";

  const root = document.getElementById("metric-explorer");
  if (!root) return;
  const runs = JSON.parse(document.getElementById("explorer-runs").textContent);
  // A page that sets its own panels (the devices page): they are shown as given and nothing is saved,
  // so that the user's layouts of the run and comparison pages stay theirs.
  const fixedPanelsScript = document.getElementById("explorer-fixed-panels");
  const fixedPanels = fixedPanelsScript ? JSON.parse(fixedPanelsScript.textContent) : null;
  const charts = window.tandemCharts;
  const X_AXES = { rl_step: "RL step", step: "trainer step", wall_time_s: "wall time (s)", samples_trained: "samples trained" };
  const csrf = root.querySelector("[name=csrfmiddlewaretoken]").value;
  const el = {
    form: document.getElementById("explorer-add"),
    pattern: document.getElementById("explorer-pattern"),
    names: document.getElementById("explorer-names"),
    matches: document.getElementById("explorer-matches"),
    smoothing: document.getElementById("explorer-smoothing"),
    smoothingValue: document.getElementById("explorer-smoothing-value"),
    panels: document.getElementById("explorer-panels"),
    split: document.getElementById("explorer-split"),
  };
  const MAX_SPLIT_PANELS = 30;
  // What the browser tests read: each panel's drawn state, and how many layouts were saved.
  // saving: a change is not yet stored (its save is debounced, or on its way).
  // And what bench/dashboard.py times (performance.now() milliseconds, from the navigation): startedMs
  // when this script ran, drawnMs once every panel of the saved layout has drawn, and each coalesced
  // live redraw's duration (redrawMs, the newest REDRAW_TIMES_KEPT; lastRedrawMs).
  const state = (window.tandemExplorer = window.tandemMetricExplorer = {
    names: [], panels: [], saves: 0, savesAsked: 0, saving: false, ready: false,
    startedMs: performance.now(), drawnMs: null, redrawMs: [], lastRedrawMs: null, redraws: 0, liveSteps: 0,
  });
  const REDRAW_TIMES_KEPT = 10000;
  const MAX_SERIES_PER_QUERY = 50; // the series endpoint's limit (telemetry MAX_CHART_SERIES)
  const BUCKETED_AXES = new Set(["step", "rl_step"]);
  const runNames = runs.map(() => new Set()); // each run's series names, as its names endpoint and socket say
  let smoothing = 0;

  function getJSON(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } }).then((response) => {
      if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
      return response.json();
    });
  }

  // Glob as the API reads it (fnmatch): `*` any run of characters, `/` included; `?` one.
  function globMatcher(pattern) {
    const source = pattern.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".");
    return new RegExp(`^${source}$`);
  }

  // ---- the layout, saved per user ------------------------------------------------------------

  let saveTimer = null;
  let savePending = false; // a change waits for its debounced save
  function saveLayout() {
    if (fixedPanels) return;
    clearTimeout(saveTimer);
    savePending = state.saving = true;
    saveTimer = setTimeout(() => {
      savePending = false;
      state.savesAsked += 1;
      const body = {
        page: root.dataset.page,
        smoothing,
        panels: state.panels.map((panel) => ({
          pattern: panel.pattern, x_axis: panel.xAxis, log_scale: panel.logScale, y_min: panel.yMin, y_max: panel.yMax,
        })),
      };
      fetch(root.dataset.layoutUrl, {
        method: "PUT",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json", Accept: "application/json", "X-CSRFToken": csrf },
        body: JSON.stringify(body),
      }).then((response) => {
        if (!response.ok) throw new Error(`saving the explorer layout: HTTP ${response.status}`);
        state.saves += 1;
        state.saving = savePending || state.savesAsked !== state.saves;
      });
    }, 250);
  }

  // ---- one panel -----------------------------------------------------------------------------

  function button(text, title) {
    const node = document.createElement("button");
    node.type = "button";
    node.textContent = text;
    node.title = title;
    return node;
  }

  function panelElement(panel) {
    const figure = document.createElement("figure");
    figure.className = "card chart-card explorer-panel";
    figure.dataset.pattern = panel.pattern;
    const caption = document.createElement("figcaption");
    const title = document.createElement("span");
    title.className = "explorer-panel-title";
    title.textContent = panel.pattern;
    const controls = document.createElement("span");
    controls.className = "explorer-controls";

    const axis = document.createElement("select");
    axis.className = "explorer-x-axis";
    axis.setAttribute("aria-label", `${panel.pattern}: x-axis`);
    for (const [value, label] of Object.entries(X_AXES)) axis.add(new Option(label, value, false, value === panel.xAxis));
    axis.addEventListener("change", () => { panel.xAxis = axis.value; refresh(panel); saveLayout(); });

    const logLabel = document.createElement("label");
    const log = document.createElement("input");
    log.type = "checkbox";
    log.className = "explorer-log";
    log.checked = panel.logScale;
    log.addEventListener("change", () => { panel.logScale = log.checked; draw(panel); saveLayout(); });
    logLabel.append(log, " log");

    const bound = (cls, label, key) => {
      const input = document.createElement("input");
      input.type = "number";
      input.step = "any";
      input.className = cls;
      input.placeholder = label;
      input.setAttribute("aria-label", `${panel.pattern}: y ${label}`);
      if (panel[key] !== null) input.value = String(panel[key]);
      input.addEventListener("change", () => {
        panel[key] = input.value === "" ? null : Number(input.value);
        draw(panel);
        saveLayout();
      });
      return input;
    };
    const reset = button("Reset zoom", "Show every point again (double-clicking the chart does too)");
    reset.className = "explorer-reset";
    reset.addEventListener("click", () => resetZoom(panel));
    const downloads = document.createElement("span");
    downloads.className = "explorer-downloads";
    for (const format of ["csv", "json"]) {
      const link = document.createElement("a");
      link.className = `button explorer-download-${format}`;
      link.textContent = format.toUpperCase();
      link.title = `Download these series as ${format.toUpperCase()}, with every x-axis`;
      link.href = exportUrl(panel.pattern, format);
      link.download = "";
      downloads.append(link);
    }
    const png = button("PNG", "Download the chart as an image");
    png.className = "explorer-download-png";
    png.addEventListener("click", () => downloadPng(panel));
    const remove = button("Remove", "Remove this panel");
    remove.className = "explorer-remove";
    remove.addEventListener("click", () => removePanel(panel));
    downloads.append(png);
    controls.append(axis, logLabel, "y", bound("explorer-y-min", "min", "yMin"), "–", bound("explorer-y-max", "max", "yMax"),
      reset, downloads, remove);
    caption.append(title, controls);
    const chart = document.createElement("div");
    chart.className = "chart";
    const empty = document.createElement("p");
    empty.className = "chart-empty muted";
    empty.textContent = "Loading…";
    figure.append(caption, chart, empty);
    // A panel's width changes when another is added or removed (the grid reflows) and with the window:
    // the canvas follows, or it stays at its first width, clipped or short of its card.
    panel.resizeObserver = new ResizeObserver(() => {
      if (!panel.plot) return;
      const width = Math.max(chart.clientWidth, 300);
      if (width !== panel.plot.width) panel.plot.setSize({ width, height: panel.plot.height });
    });
    panel.resizeObserver.observe(chart);
    return figure;
  }

  function exportUrl(pattern, format) {
    const query = new URLSearchParams({ names: pattern, format });
    if (root.dataset.page === "compare") {
      query.set("runs", runs.map((run) => run.id).join(","));
      return `${root.dataset.compareExportUrl}?${query}`;
    }
    return `${runs[0].export_url}?${query}`;
  }

  // "buckets" on the step axes, "export" on the summed ones (see the top of this file).
  function sourceFor(panel) {
    return BUCKETED_AXES.has(panel.xAxis) && runs.every((run) => run.series_url) ? "buckets" : "export";
  }

  // Buckets asked of the series endpoint: it answers between this and twice as many, so about one per
  // pixel of the panel's width. Fewer would show the eye less than the canvas can; more costs drawing.
  function bucketsWanted(panel) {
    const width = panel.element.querySelector(".chart").clientWidth || 600;
    return Math.max(100, Math.ceil(width / 2));
  }

  // One run's series of the panel, bucketed: {first_step, last_step, count, mean} columns per series,
  // and the answer's resolution (steps per bucket; 1: raw points), which live points are binned by.
  async function loadBuckets(panel, run, runIndex) {
    const matcher = globMatcher(panel.pattern);
    const names = [...runNames[runIndex]].filter((name) => matcher.test(name)).sort();
    const table = { run: run.id, name: run.name, sft_steps: run.sft_steps, names, resolution: 1, buckets: {} };
    const body = await bucketedSeries(run, names, bucketsWanted(panel));
    table.resolution = body.resolution;
    for (const name of names) {
      const series = body.series[name];
      if (series) {
        table.buckets[name] = { first: series.first_step, last: series.last_step, count: series.count, mean: series.mean };
      }
    }
    return table;
  }

  // The panels that load in the same turn of the event loop (a page's saved layout) ask for their
  // series together: one request of up to MAX_SERIES_PER_QUERY series, not one per panel, which
  // the platform would answer one after the other.
  const bucketBatches = new Map(); // series URL and bucket count -> {names, answer}
  function bucketedSeries(run, names, points) {
    const key = `${run.series_url}|${points}`;
    let batch = bucketBatches.get(key);
    if (!batch) {
      batch = { names: new Set() };
      bucketBatches.set(key, batch);
      batch.answer = new Promise((resolve) => setTimeout(resolve, 0)).then(async () => {
        bucketBatches.delete(key);
        const wanted = [...batch.names].sort();
        const bodies = [];
        for (let start = 0; start < wanted.length; start += MAX_SERIES_PER_QUERY) {
          const query = new URLSearchParams({ names: wanted.slice(start, start + MAX_SERIES_PER_QUERY).join(","), points });
          bodies.push(getJSON(`${run.series_url}?${query}`));
        }
        const answer = { resolution: 1, series: {} };
        for (const body of await Promise.all(bodies)) {
          answer.resolution = Math.max(answer.resolution, body.resolution);
          Object.assign(answer.series, body.series);
        }
        return answer;
      });
    }
    names.forEach((name) => batch.names.add(name));
    return batch.answer;
  }

  // Each run's table: bucketed, or as the export endpoint answers it (every x-axis, each series by step).
  async function load(panel) {
    const source = sourceFor(panel);
    if (source === "buckets") {
      panel.tables = await Promise.all(runs.map((run, runIndex) => loadBuckets(panel, run, runIndex)));
    } else {
      const query = new URLSearchParams({ names: panel.pattern, format: "json" });
      panel.tables = await Promise.all(runs.map((run) => getJSON(`${run.export_url}?${query}`)));
    }
    panel.source = source;
    panel.loaded = true;
  }

  // A panel whose axis moved between the step axes and the summed ones reads its series again.
  async function refresh(panel) {
    if (panel.source !== sourceFor(panel)) {
      panel.loaded = false;
      await load(panel);
    }
    draw(panel);
  }

  // A table's x column for an axis (the export calls the trainer step's column `steps`).
  function xColumn(table, axis) {
    return axis === "step" ? table.steps : table[axis];
  }

  // A table's series as {name, x, y}: a bucket sits at the middle of the steps its points are at.
  function tableSeries(panel, table) {
    if (panel.source !== "buckets") {
      const x = xColumn(table, panel.xAxis);
      return table.names.map((name) => ({ name, x, y: table.series[name] }));
    }
    const offset = panel.xAxis === "rl_step" ? table.sft_steps : 0;
    return table.names.filter((name) => table.buckets[name]).map((name) => {
      const { first, last, mean } = table.buckets[name];
      return { name, x: first.map((step, i) => (step + last[i]) / 2 - offset), y: mean };
    });
  }

  // uPlot data: one x column merged over the runs, a y column per run and series (null where absent).
  function chartData(panel) {
    const compared = runs.length > 1;
    const xs = new Set();
    const columns = [];
    panel.tables.forEach((table, runIndex) => {
      for (const { name, x, y } of tableSeries(panel, table)) {
        // One value per x: several SFT steps share a samples-trained value (none trained), the last wins.
        const byX = new Map();
        y.forEach((value, i) => {
          if (value === null || (panel.logScale && value <= 0)) return;
          byX.set(x[i], value);
        });
        byX.forEach((_, value) => xs.add(value));
        columns.push({ label: compared ? `${table.name} #${table.run} · ${name}` : name, byX, runIndex });
      }
    });
    const sorted = [...xs].sort((a, b) => a - b);
    const data = [sorted, ...columns.map((column) => charts.smoothed(sorted.map((x) => (column.byX.has(x) ? column.byX.get(x) : null)), smoothing))];
    return { data, columns };
  }

  // Where the SFT phase ends on this x-axis, per run that had one (deduplicated: on the RL-step axis
  // every run's boundary is its 0).
  function boundaries(panel) {
    const found = new Set();
    for (const table of panel.tables) {
      if (!table.sft_steps) continue;
      if (panel.xAxis === "rl_step") found.add(0);
      else if (panel.xAxis === "step") found.add(table.sft_steps);
      else {
        const index = table.steps.findIndex((step) => step >= table.sft_steps);
        if (index >= 0) found.add(xColumn(table, panel.xAxis)[index]);
      }
    }
    return [...found];
  }

  // Tick labels short enough for the axis: uPlot's own ("10,737,418,240") are cut to "0,000".
  const compact = new Intl.NumberFormat("en", { notation: "compact", maximumFractionDigits: 1 });
  // uPlot passes null for the ticks it leaves unlabelled (a log axis's minor ones).
  const tickValues = (u, ticks) => ticks.map((tick) => (tick === null ? null
    : Math.abs(tick) >= 1000 ? compact.format(tick) : String(Number(tick.toPrecision(6)))));

  function yRangeOf(panel) {
    return (u, min, max) => {
      let auto;
      if (min === null || max === null) auto = panel.logScale ? [0.1, 10] : [0, 1];
      else if (panel.logScale) auto = min === max ? [min / 10, max * 10] : uPlot.rangeLog(min, max, 10, true);
      // charts.js gives constant series room either side (the dashboard's fix, shared).
      else auto = charts.yRange ? charts.yRange(u, min, max) : uPlot.rangeNum(min, max, 0.1, true);
      return [panel.yMin ?? auto[0], panel.yMax ?? auto[1]];
    };
  }

  function drawBoundaries(panel) {
    return (u) => {
      const { ctx } = u;
      ctx.save();
      ctx.strokeStyle = "#6b7280";
      ctx.fillStyle = "#6b7280";
      ctx.setLineDash([6, 4]);
      ctx.lineWidth = Math.max(1, devicePixelRatio);
      ctx.font = `${11 * devicePixelRatio}px sans-serif`;
      for (const x of panel.boundaries) {
        if (x < u.scales.x.min || x > u.scales.x.max) continue;
        const left = Math.round(u.valToPos(x, "x", true));
        ctx.beginPath();
        ctx.moveTo(left, u.bbox.top);
        ctx.lineTo(left, u.bbox.top + u.bbox.height);
        ctx.stroke();
        ctx.fillText("SFT → RL", left + 4 * devicePixelRatio, u.bbox.top + 12 * devicePixelRatio);
      }
      ctx.restore();
    };
  }

  // A live redraw: new data into the same plot when its series are the same, else a new plot. The x
  // range follows the newest step unless the user zoomed in (then it stays where they put it).
  function redrawLive(panel) {
    if (!panel.loaded) return;
    const { data, columns } = chartData(panel);
    const key = columns.map((column) => column.label).join("|");
    if (!panel.plot || key !== panel.plotKey) {
      draw(panel);
      return;
    }
    const u = panel.plot;
    const oldXs = u.data[0];
    const zoomed = oldXs.length > 0 && (u.scales.x.min > oldXs[0] || u.scales.x.max < oldXs[oldXs.length - 1]);
    panel.points = data.slice(1).map((column) => column.filter((value) => value !== null).length);
    u.batch(() => u.setData(data, !zoomed));
  }

  function draw(panel) {
    if (!panel.loaded) return;
    const container = panel.element.querySelector(".chart");
    const empty = panel.element.querySelector(".chart-empty");
    const { data, columns } = chartData(panel);
    panel.names = [...new Set(panel.tables.flatMap((table) => table.names))];
    panel.boundaries = boundaries(panel);
    panel.points = data.slice(1).map((column) => column.filter((value) => value !== null).length);
    if (panel.plot) panel.plot.destroy();
    panel.plot = null;
    empty.hidden = columns.length > 0;
    empty.textContent = `No series of ${runs.length > 1 ? "these runs" : "this run"} matches ${panel.pattern}.`;
    if (columns.length === 0) return;
    panel.plotKey = columns.map((column) => column.label).join("|");
    panel.plot = new uPlot(
      {
        width: Math.max(container.clientWidth, 300),
        height: 260,
        scales: {
          x: { time: false },
          y: panel.logScale ? { distr: 3, log: 10, range: yRangeOf(panel) } : { range: yRangeOf(panel) },
        },
        series: [
          { label: X_AXES[panel.xAxis] },
          ...columns.map((column, index) => ({
            label: column.label,
            stroke: charts.colour(runs.length > 1 ? column.runIndex : index),
            width: 2,
            spanGaps: true,
            points: { show: charts.pointsWhenAlone || false },
          })),
        ],
        axes: [{ label: X_AXES[panel.xAxis], incrs: panel.xAxis.endsWith("step") ? charts.STEP_INCREMENTS : undefined }, { values: tickValues }],
        hooks: {
          draw: [
            drawBoundaries(panel),
            (u) => { panel.yScale = [u.scales.y.min, u.scales.y.max]; panel.xScale = [u.scales.x.min, u.scales.x.max]; },
          ],
        },
      },
      data,
      container,
    );
  }

  function resetZoom(panel) {
    if (!panel.plot) return;
    const xs = panel.plot.data[0];
    panel.plot.setScale("x", { min: xs[0], max: xs[xs.length - 1] });
  }

  // The chart as an image that stands on its own in a slide or a report: a title (the panel's series and
  // runs), the chart as drawn (uPlot's canvas, axes included), and a legend of its series in their
  // colours below, on white (a transparent PNG reads badly).
  const PNG_FONT_PX = 13;
  function downloadPng(panel) {
    if (!panel.plot) return;
    const u = panel.plot;
    const source = u.ctx.canvas;
    const scale = source.width / u.width; // the canvas is drawn at the device's pixel ratio
    const font = `${PNG_FONT_PX * scale}px sans-serif`;
    const title = `${panel.pattern} · ${runs.map((run) => run.name).join(", ")} · x: ${X_AXES[panel.xAxis]}`;
    const legend = u.series.slice(1).map((series, index) => ({ label: series.label, colour: series.stroke(u, index + 1) }));
    const line = Math.ceil(PNG_FONT_PX * 1.6 * scale);
    const pad = Math.ceil(8 * scale);
    const canvas = document.createElement("canvas");
    const measure = canvas.getContext("2d");
    measure.font = font;
    // Legend entries flow left to right and wrap at the chart's width.
    const rows = [[]];
    let x = pad;
    for (const entry of legend) {
      const width = Math.ceil(measure.measureText(entry.label).width + 3 * line / 2);
      if (x + width > source.width && rows[rows.length - 1].length) { rows.push([]); x = pad; }
      rows[rows.length - 1].push({ ...entry, x });
      x += width;
    }
    canvas.width = source.width;
    canvas.height = line + pad + source.height + rows.length * line + pad;
    const ctx = canvas.getContext("2d");
    ctx.fillStyle = "#ffffff";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    ctx.font = `bold ${font}`;
    ctx.fillStyle = "#111827";
    ctx.textBaseline = "middle";
    ctx.fillText(title, pad, pad + line / 2, canvas.width - 2 * pad);
    ctx.drawImage(source, 0, line + pad);
    ctx.font = font;
    rows.forEach((row, rowIndex) => {
      const y = line + pad + source.height + rowIndex * line + line / 2;
      for (const entry of row) {
        ctx.fillStyle = entry.colour;
        ctx.fillRect(entry.x, y - line / 8, line / 2, line / 4);
        ctx.fillStyle = "#111827";
        ctx.fillText(entry.label, entry.x + line * 0.75, y);
      }
    });
    state.lastPng = { title, legend: legend.map((entry) => entry.label), width: canvas.width, height: canvas.height,
                      chartHeight: source.height };
    const link = document.createElement("a");
    link.href = canvas.toDataURL("image/png");
    link.download = `${panel.pattern.replace(/[^A-Za-z0-9_.-]+/g, "_")}.png`;
    document.body.append(link);
    link.click();
    link.remove();
  }

  async function addPanel(options) {
    const panel = {
      pattern: options.pattern,
      xAxis: options.x_axis || "step",
      logScale: Boolean(options.log_scale),
      yMin: options.y_min ?? null,
      yMax: options.y_max ?? null,
      loaded: false,
      plot: null,
    };
    panel.element = panelElement(panel);
    sectionFor(panel.pattern).querySelector(".charts").append(panel.element);
    countSections();
    state.panels.push(panel);
    await load(panel);
    draw(panel);
    return panel;
  }

  function removePanel(panel) {
    panel.resizeObserver.disconnect();
    if (panel.plot) panel.plot.destroy();
    panel.loaded = false; // a live redraw already asked for draws nothing
    panel.element.remove();
    state.panels.splice(state.panels.indexOf(panel), 1);
    countSections();
    saveLayout();
  }

  // ---- sections: the panels of a layout grouped by their series' first name part (algorithm/,
  // rollout/, device/ ...; "general" for names without one), each folded away on its own.

  function sectionName(pattern) {
    const head = pattern.split("/")[0];
    return pattern.includes("/") && !/[*?]/.test(head) ? head : "general";
  }

  function sectionFor(pattern) {
    const name = sectionName(pattern);
    let section = el.panels.querySelector(`.explorer-section[data-section="${CSS.escape(name)}"]`);
    if (section) return section;
    section = document.createElement("details");
    section.className = "explorer-section";
    section.dataset.section = name;
    section.open = true;
    const summary = document.createElement("summary");
    const title = document.createElement("span");
    title.className = "explorer-section-title";
    title.textContent = name;
    const count = document.createElement("span");
    count.className = "explorer-section-count muted";
    summary.append(title, " ", count);
    const grid = document.createElement("div");
    grid.className = "charts";
    section.append(summary, grid);
    // Sections in name order, "general" first.
    const rank = (section) => (section === "general" ? "" : section);
    const after = [...el.panels.querySelectorAll(".explorer-section")].find((other) => rank(other.dataset.section) > rank(name));
    el.panels.insertBefore(section, after || null);
    return section;
  }

  function countSections() {
    for (const section of el.panels.querySelectorAll(".explorer-section")) {
      const panels = section.querySelectorAll(".explorer-panel").length;
      if (!panels) section.remove();
      else section.querySelector(".explorer-section-count").textContent = `(${panels} panel${panels === 1 ? "" : "s"})`;
    }
  }

  // ---- the toolbar ---------------------------------------------------------------------------

  function showMatches() {
    const pattern = el.pattern.value.trim();
    if (!pattern) {
      el.matches.textContent = "";
      return;
    }
    const matcher = globMatcher(pattern);
    const count = state.names.filter((name) => matcher.test(name)).length;
    el.matches.textContent = `${count} series match${count === 1 ? "es" : ""}`;
  }

  el.pattern.addEventListener("input", showMatches);
  el.form.addEventListener("submit", (event) => {
    event.preventDefault();
    const pattern = el.pattern.value.trim();
    if (!pattern) return;
    const x_axis = runs.length > 1 ? "rl_step" : "step";
    // A glob split into its matches: a panel per series (at most MAX_SPLIT_PANELS), each on its own axis.
    const matcher = globMatcher(pattern);
    const matches = el.split.checked ? state.names.filter((name) => matcher.test(name)) : [];
    if (matches.length > MAX_SPLIT_PANELS) {
      el.matches.textContent = `${matches.length} series match: a panel each is at most ${MAX_SPLIT_PANELS}; narrow the glob`;
      return;
    }
    el.pattern.value = "";
    showMatches();
    if (matches.length) matches.forEach((name) => addPanel({ pattern: name, x_axis }));
    else addPanel({ pattern, x_axis });
    saveLayout();
  });
  el.smoothing.addEventListener("input", () => {
    smoothing = Number(el.smoothing.value);
    el.smoothingValue.textContent = smoothing.toFixed(2);
    state.panels.forEach(draw);
    saveLayout();
  });

  async function start() {
    const [layout, ...nameLists] = await Promise.all([
      fixedPanels ? { smoothing: 0, panels: fixedPanels } : getJSON(`${root.dataset.layoutUrl}?page=${root.dataset.page}`),
      ...runs.map((run) => getJSON(run.names_url)),
    ]);
    state.names = [...new Set(nameLists.flatMap((body) => body.names))].sort();
    for (const name of state.names) el.names.append(new Option(name));
    smoothing = layout.smoothing;
    el.smoothing.value = String(smoothing);
    el.smoothingValue.textContent = smoothing.toFixed(2);
    nameLists.forEach((body, runIndex) => body.names.forEach((name) => runNames[runIndex].add(name)));
    await Promise.all(layout.panels.map(addPanel));
    // A new plot draws in a microtask, a redraw in the frame after: every panel has drawn by this frame's end.
    await new Promise((resolve) => requestAnimationFrame(() => setTimeout(resolve)));
    state.drawnMs = performance.now();
    state.ready = true;
  }

  // ---- live: the run page's WebSocket ---------------------------------------------------------

  const panelsToRedraw = new Set();
  let redrawFrame = null;

  // One point of a series joins its newest bucket while it is at that bucket's steps (the resolution
  // the panel was read at), else starts the next one: live steps keep the density the panel was read at.
  function appendPoint(buckets, resolution, step, value) {
    const newest = buckets.first.length - 1;
    if (newest >= 0 && step <= buckets.last[newest]) return false; // read already, or older than the chart
    if (newest >= 0 && Math.floor(step / resolution) === Math.floor(buckets.first[newest] / resolution)) {
      const count = buckets.count[newest];
      buckets.mean[newest] = (buckets.mean[newest] * count + value) / (count + 1);
      buckets.count[newest] = count + 1;
      buckets.last[newest] = step;
    } else {
      buckets.first.push(step);
      buckets.last.push(step);
      buckets.count.push(1);
      buckets.mean.push(value);
    }
    return true;
  }

  function ingestLive(step, values) {
    state.liveSteps += 1;
    for (const name of Object.keys(values)) {
      if (runNames[0].has(name)) continue;
      runNames[0].add(name);
      state.names.push(name);
      el.names.append(new Option(name));
    }
    for (const panel of state.panels) {
      if (!panel.loaded || panel.source !== "buckets") continue;
      const table = panel.tables[0];
      const matcher = panel.matcher || (panel.matcher = globMatcher(panel.pattern));
      for (const [name, value] of Object.entries(values)) {
        if (value === null || !Number.isFinite(value) || !matcher.test(name)) continue;
        if (!table.buckets[name]) {
          table.names.push(name);
          table.buckets[name] = { first: [], last: [], count: [], mean: [] };
        }
        if (appendPoint(table.buckets[name], table.resolution, step, value)) panelsToRedraw.add(panel);
      }
    }
    if (panelsToRedraw.size > 0 && redrawFrame === null) redrawFrame = requestAnimationFrame(redrawChanged);
  }

  function redrawChanged() {
    redrawFrame = null;
    const started = performance.now();
    for (const panel of panelsToRedraw) redrawLive(panel);
    panelsToRedraw.clear();
    state.lastRedrawMs = performance.now() - started;
    state.redrawMs.push(state.lastRedrawMs);
    if (state.redrawMs.length > REDRAW_TIMES_KEPT) state.redrawMs.shift();
    state.redraws += 1;
  }

  // Only a single run's page is live (comparison has no socket). A reconnect may have dropped
  // messages: the bucketed panels read their series again, as the run page backfills its charts.
  if (runs.length === 1) {
    window.addEventListener("tandem:run-metrics", (event) => {
      if (state.ready) ingestLive(event.detail.step, event.detail.values);
    });
    window.addEventListener("tandem:run-reconnected", () => {
      if (!state.ready) return;
      for (const panel of state.panels) if (panel.source === "buckets") load(panel).then(() => draw(panel));
    });
  }

  start();
})();
