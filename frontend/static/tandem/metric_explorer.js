// The metric explorer: panels of any logged series, found by name or glob, on the run page and in
// comparison (runs/_metric_explorer.html). Each panel has its x-axis (RL step, trainer step, wall
// time, samples trained), log scale, y-range, reset zoom, the SFT → RL boundary, and its downloads.
//
// A panel's data is the export endpoint's JSON (GET /api/runs/<id>/metrics/export/?names=<glob>),
// which expands the glob and carries every x-axis, so this script computes none of them. The layout
// (panels, their options, the smoothing) is the user's, saved over the API at each change.
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
  };
  // What the browser tests read: each panel's drawn state, and how many layouts were saved.
  // saving: a change is not yet stored (its save is debounced, or on its way).
  const state = (window.tandemExplorer = { names: [], panels: [], saves: 0, savesAsked: 0, saving: false, ready: false });
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

  // Exponential moving average over the non-null values; 0 leaves them raw.
  function smoothed(values, weight) {
    if (weight <= 0) return values;
    let average = null;
    return values.map((value) => {
      if (value === null) return null;
      average = average === null ? value : weight * average + (1 - weight) * value;
      return average;
    });
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
    axis.addEventListener("change", () => { panel.xAxis = axis.value; draw(panel); saveLayout(); });

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

  // Each run's table, as the export endpoint answers it (every x-axis, each series by step).
  async function load(panel) {
    const query = new URLSearchParams({ names: panel.pattern, format: "json" });
    panel.tables = await Promise.all(runs.map((run) => getJSON(`${run.export_url}?${query}`)));
    panel.loaded = true;
  }

  // A table's x column for an axis (the export calls the trainer step's column `steps`).
  function xColumn(table, axis) {
    return axis === "step" ? table.steps : table[axis];
  }

  // uPlot data: one x column merged over the runs, a y column per run and series (null where absent).
  function chartData(panel) {
    const compared = runs.length > 1;
    const xs = new Set();
    const columns = [];
    panel.tables.forEach((table, runIndex) => {
      const x = xColumn(table, panel.xAxis);
      for (const name of table.names) {
        // One value per x: several SFT steps share a samples-trained value (none trained), the last wins.
        const byX = new Map();
        table.series[name].forEach((value, i) => {
          if (value === null || (panel.logScale && value <= 0)) return;
          byX.set(x[i], value);
        });
        byX.forEach((_, value) => xs.add(value));
        columns.push({ label: compared ? `${table.name} #${table.run} · ${name}` : name, byX, runIndex });
      }
    });
    const sorted = [...xs].sort((a, b) => a - b);
    const data = [sorted, ...columns.map((column) => smoothed(sorted.map((x) => (column.byX.has(x) ? column.byX.get(x) : null)), smoothing))];
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
  const tickValues = (u, ticks) => ticks.map((tick) => (Math.abs(tick) >= 1000 ? compact.format(tick)
    : String(Number(tick.toPrecision(6)))));

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

  // The chart as drawn (uPlot's canvas), on white: a transparent PNG reads badly in slides.
  function downloadPng(panel) {
    if (!panel.plot) return;
    const source = panel.plot.ctx.canvas;
    const canvas = document.createElement("canvas");
    canvas.width = source.width;
    canvas.height = source.height;
    const ctx = canvas.getContext("2d");
    ctx.fillStyle = "#ffffff";
    ctx.fillRect(0, 0, canvas.width, canvas.height);
    ctx.drawImage(source, 0, 0);
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
    el.panels.append(panel.element);
    state.panels.push(panel);
    await load(panel);
    draw(panel);
    return panel;
  }

  function removePanel(panel) {
    if (panel.plot) panel.plot.destroy();
    panel.element.remove();
    state.panels.splice(state.panels.indexOf(panel), 1);
    saveLayout();
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
    el.pattern.value = "";
    showMatches();
    addPanel({ pattern, x_axis: runs.length > 1 ? "rl_step" : "step" });
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
    await Promise.all(layout.panels.map(addPanel));
    state.ready = true;
  }

  start();
})();
