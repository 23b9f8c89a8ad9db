// The project workspace (workspaces/workspace.html) and the live panels a report embeds (workspaces/report.html).
//
// A view is the page's query string, read and written here and validated by the platform
// (workspaces/view_state.py, which documents each key): the runs it selects (q, status, and the table's
// column filters f.<column>, applied by the platform), the metrics drawn (m, a panel each), what groups and
// colours the runs (g: tag or config.<path>), the x-axis (x), smoothing (s), zoom (z), log scales (log), y
// ranges (y.<metric>), the table's columns (c) and sort (o). Every change rewrites the URL, so a view is
// shared by its address and saved by name (POST /api/projects/<id>/views/).
//
// The runs come from GET /api/projects/<id>/workspace/runs/?<view>, their series from one request per
// draw (GET .../workspace/series/?runs=&names=&points=): min, max and mean per bucket on one step grid for
// every run, so that hundreds overlay. Each run draws a smoothed line over its faint raw one and a min–max
// band where a bucket holds several steps. The project's socket (/ws/projects/<id>/) brings each step of
// every run: it joins the run's newest bucket and the changed panels redraw once per animation frame.
(function () {
  "use strict";

  const charts = window.tandemCharts;
  const BUILTIN_LABELS = { name: "Run", status: "Status", tags: "Tags", group: "Group", duration: "Duration", step: "Step" };
  const MAX_METRICS = 8; // view_state.MAX_METRICS
  const DEFAULT_METRICS = ["reward_mean"];
  const DEFAULT_SMOOTHING = 0.6;
  const PANEL_HEIGHT = 240;
  const NO_GROUP = "(none)";
  // What the browser tests and bench/dashboard.py read: drawnMs once every panel drew after the page's
  // first load (performance.now(), from the navigation), each live redraw's duration (redrawMs), and
  // the steps the socket brought (liveSteps).
  const probe = (window.tandemWorkspace = {
    startedMs: performance.now(), drawnMs: null, redrawMs: [], liveSteps: 0, loads: 0, panels: {}, runs: [],
    saves: 0, errors: [],
  });

  function getJSON(url) {
    return fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } }).then(async (response) => {
      if (!response.ok) {
        const body = await response.json().catch(() => null);
        throw new Error(body?.error?.message || `${url}: HTTP ${response.status}`);
      }
      return response.json();
    });
  }

  // ---- the view, as its query string says it ------------------------------------------------------

  function parseView(search) {
    const params = new URLSearchParams(search);
    const list = (key) => (params.get(key) || "").split(",").map((part) => part.trim()).filter(Boolean);
    const pair = (text) => text.split(",").map((part) => (part === "" ? null : Number(part)));
    const view = {
      q: params.get("q") || "", status: params.get("status") || "",
      metrics: params.has("m") ? list("m") : [...DEFAULT_METRICS],
      group: params.get("g") || "", x: params.get("x") || "step",
      smoothing: params.has("s") ? Number(params.get("s")) : DEFAULT_SMOOTHING,
      zoom: params.get("z") ? pair(params.get("z")) : null,
      log: new Set(list("log")), yRanges: {}, columns: list("c"), sort: params.get("o") || "", filters: {},
      viewId: params.get("view") || "",
    };
    for (const [key, value] of params) {
      if (key.startsWith("y.")) view.yRanges[key.slice(2)] = pair(value);
      if (key.startsWith("f.") && value) view.filters[key.slice(2)] = value;
    }
    return view;
  }

  // The canonical query, in view_state.WorkspaceView.query()'s order (only what differs from the defaults).
  function viewQuery(view, { withViewId = true } = {}) {
    const pairs = [];
    const bound = (value) => (value === null || value === undefined ? "" : String(value));
    if (view.q) pairs.push(["q", view.q]);
    if (view.status) pairs.push(["status", view.status]);
    if (view.metrics.join(",") !== DEFAULT_METRICS.join(",")) pairs.push(["m", view.metrics.join(",")]);
    if (view.group) pairs.push(["g", view.group]);
    if (view.x !== "step") pairs.push(["x", view.x]);
    if (view.smoothing !== DEFAULT_SMOOTHING) pairs.push(["s", String(view.smoothing)]);
    if (view.zoom) pairs.push(["z", view.zoom.map(bound).join(",")]);
    if (view.log.size) pairs.push(["log", [...view.log].join(",")]);
    for (const name of Object.keys(view.yRanges).sort()) pairs.push([`y.${name}`, view.yRanges[name].map(bound).join(",")]);
    if (view.columns.length) pairs.push(["c", view.columns.join(",")]);
    if (view.sort) pairs.push(["o", view.sort]);
    for (const column of Object.keys(view.filters).sort()) pairs.push([`f.${column}`, view.filters[column]]);
    if (withViewId && view.viewId) pairs.push(["view", view.viewId]);
    return new URLSearchParams(pairs).toString();
  }

  // ---- one workspace: its panels (and, when interactive, its controls and table) -------------------

  function mount(root, { projectId, query, interactive, websocketPath }) {
    const view = parseView(query);
    const panelsElement = root.querySelector(".workspace-panels");
    const legendElement = root.querySelector(".workspace-legend");
    const summaryElement = root.querySelector(".workspace-summary");
    const state = { runs: [], resolution: 1, series: {}, panels: new Map(), groups: new Map(), dirty: new Map(), frame: null };
    const apiBase = `/api/projects/${projectId}`;

    function changed({ reloadRuns = false, reloadSeries = false, redraw = false } = {}) {
      if (interactive) history.replaceState(null, "", `${location.pathname}?${viewQuery(view)}`);
      if (reloadRuns) return loadRuns();
      if (reloadSeries) return loadSeries();
      if (redraw) drawAll();
      return Promise.resolve();
    }

    // -- runs, groups and colours

    function groupOf(run) { return view.group ? (run.group ?? NO_GROUP) : `#${run.id}`; }

    function assignGroups() {
      const labels = [...new Set(state.runs.map(groupOf))].sort((a, b) => a.localeCompare(b, undefined, { numeric: true }));
      state.groups = new Map(labels.map((label, index) => [label, { colour: charts.PALETTE[index % charts.PALETTE.length], count: 0 }]));
      for (const run of state.runs) state.groups.get(groupOf(run)).count += 1;
      drawLegend();
    }

    function drawLegend() {
      if (!legendElement) return;
      legendElement.replaceChildren();
      if (!view.group && state.runs.length > 12) {
        legendElement.textContent = `${state.runs.length} runs, a colour each; group them by a tag or a config key to compare groups.`;
        return;
      }
      for (const [label, group] of state.groups) {
        const item = document.createElement("span");
        item.className = "workspace-legend-item";
        item.dataset.group = label;
        const swatch = document.createElement("span");
        swatch.className = "swatch";
        swatch.style.background = group.colour;
        const run = view.group ? null : state.runs.find((candidate) => `#${candidate.id}` === label);
        item.append(swatch, view.group ? `${label} (${group.count})` : `${run.name} #${run.id}`);
        legendElement.append(item);
      }
    }

    async function loadRuns() {
      const body = await getJSON(`${apiBase}/workspace/runs/?${viewQuery(view, { withViewId: false })}`);
      const before = state.runs.map((run) => run.id).join(",");
      state.runs = body.runs;
      probe.runs = body.runs.map((run) => ({ id: run.id, name: run.name, group: run.group }));
      probe.matched = body.matched;
      assignGroups();
      if (summaryElement) {
        const parts = [`${body.runs.length} run${body.runs.length === 1 ? "" : "s"} shown`];
        if (body.filtered_out) parts.push(`${body.filtered_out} left out by the column filters`);
        if (body.matched > body.read) parts.push(`only the newest ${body.read} of the ${body.matched} matching runs are read`);
        summaryElement.textContent = `${parts.join("; ")}.`;
      }
      if (interactive) table.update(body);
      if (before !== state.runs.map((run) => run.id).join(",") || !probe.loads) return loadSeries();
      drawAll();
    }

    // -- series

    function pointsWanted() {
      // About one bucket per 4 pixels for a few runs, fewer as runs pile up (6,000 points a panel, which
      // uPlot redraws live within a frame): 200 runs of 30 to 60 buckets, whose lines would be no clearer
      // with more. Zooming in reads the range again, finer.
      const width = panelsElement.clientWidth / Math.min(2, Math.max(1, view.metrics.length)) || 600;
      const perRun = Math.floor(6000 / Math.max(1, state.runs.length));
      return Math.max(20, Math.min(Math.ceil(width / 4), perRun, 2000));
    }

    let seriesRequest = 0;
    async function loadSeries() {
      const request = ++seriesRequest;
      const ids = state.runs.map((run) => run.id);
      if (!ids.length || !view.metrics.length) {
        state.series = {};
        drawAll();
        return;
      }
      const params = new URLSearchParams({ runs: ids.join(","), names: view.metrics.join(","), points: String(pointsWanted()) });
      if (view.zoom && view.x === "step") {
        if (view.zoom[0] !== null) params.set("from_step", String(Math.max(0, Math.floor(view.zoom[0]))));
        if (view.zoom[1] !== null) params.set("to_step", String(Math.ceil(view.zoom[1])));
      }
      const body = await getJSON(`${apiBase}/workspace/series/?${params}`);
      if (request !== seriesRequest) return; // a newer request answers for the view as it is now
      state.resolution = body.resolution;
      state.series = {};
      for (const [runId, byName] of Object.entries(body.series)) {
        for (const [name, columns] of Object.entries(byName)) {
          (state.series[name] ||= {})[runId] = columns;
        }
      }
      drawAll();
      probe.loads += 1;
      if (probe.drawnMs === null) probe.drawnMs = performance.now();
    }

    // -- panels

    function panelFor(name) {
      let panel = state.panels.get(name);
      if (panel) return panel;
      const figure = document.createElement("figure");
      figure.className = "card chart-card workspace-panel";
      figure.dataset.metric = name;
      const caption = document.createElement("figcaption");
      const title = document.createElement("span");
      title.className = "workspace-panel-title";
      title.textContent = name;
      const readout = document.createElement("span");
      readout.className = "workspace-readout muted small";
      caption.append(title, readout);
      if (interactive) {
        const controls = document.createElement("span");
        controls.className = "explorer-controls";
        const logLabel = document.createElement("label");
        const log = document.createElement("input");
        log.type = "checkbox";
        log.className = "workspace-log";
        log.checked = view.log.has(name);
        log.addEventListener("change", () => {
          if (log.checked) view.log.add(name); else view.log.delete(name);
          changed({ redraw: true });
        });
        logLabel.append(log, " log");
        const bound = (index, label) => {
          const input = document.createElement("input");
          input.type = "number";
          input.step = "any";
          input.placeholder = label;
          input.className = `workspace-y-${label}`;
          input.setAttribute("aria-label", `${name}: y ${label}`);
          const range = view.yRanges[name];
          if (range && range[index] !== null) input.value = String(range[index]);
          input.addEventListener("change", () => {
            const next = [...(view.yRanges[name] || [null, null])];
            next[index] = input.value === "" ? null : Number(input.value);
            if (next[0] === null && next[1] === null) delete view.yRanges[name]; else view.yRanges[name] = next;
            changed({ redraw: true });
          });
          return input;
        };
        const remove = document.createElement("button");
        remove.type = "button";
        remove.className = "workspace-remove";
        remove.textContent = "Remove";
        remove.addEventListener("click", () => {
          view.metrics = view.metrics.filter((metric) => metric !== name);
          destroyPanel(name);
          controls_.metrics.value = view.metrics.join(",");
          changed({ redraw: true });
        });
        controls.append(logLabel, "y", bound(0, "min"), "–", bound(1, "max"), remove);
        caption.append(controls);
      }
      const chart = document.createElement("div");
      chart.className = "chart";
      const empty = document.createElement("p");
      empty.className = "chart-empty muted";
      empty.hidden = true;
      figure.append(caption, chart, empty);
      panelsElement.append(figure);
      panel = { name, figure, chart, empty, readout, plot: null, columns: [] };
      panel.resizeObserver = new ResizeObserver(() => {
        if (panel.plot && Math.max(chart.clientWidth, 300) !== panel.plot.width) {
          panel.plot.setSize({ width: Math.max(chart.clientWidth, 300), height: PANEL_HEIGHT });
        }
      });
      panel.resizeObserver.observe(chart);
      state.panels.set(name, panel);
      return panel;
    }

    function destroyPanel(name) {
      const panel = state.panels.get(name);
      if (!panel) return;
      panel.resizeObserver.disconnect();
      if (panel.plot) panel.plot.destroy();
      panel.figure.remove();
      state.panels.delete(name);
      delete probe.panels[name];
    }

    // The panel's data on one x column: per run its bucket means (raw), smoothed, and min and max.
    function panelData(name) {
      const byRun = state.series[name] || {};
      const shown = state.runs.filter((run) => byRun[run.id]);
      const xs = new Set();
      for (const run of shown) {
        const offset = xOffset(run);
        for (const x of byRun[run.id].x) xs.add(x - offset);
      }
      const x = [...xs].sort((a, b) => a - b);
      const index = new Map(x.map((value, i) => [value, i]));
      return { x, index, columns: shown.map((run) => runColumn(name, run, x, index)) };
    }

    function xOffset(run) { return view.x === "rl_step" ? run.sft_steps : 0; }

    function runColumn(name, run, x, index) {
      const source = state.series[name][run.id];
      const offset = xOffset(run);
      const logged = view.log.has(name);
      const raw = new Array(x.length).fill(null);
      const low = new Array(x.length).fill(null);
      const high = new Array(x.length).fill(null);
      source.x.forEach((step, i) => {
        const at = index.get(step - offset);
        if (logged && source.mean[i] <= 0) return;
        raw[at] = source.mean[i];
        low[at] = source.min[i];
        high[at] = source.max[i];
      });
      return { run, raw, low, high, smooth: charts.smoothed(raw, view.smoothing), colour: state.groups.get(groupOf(run)).colour };
    }

    // Every run's band (each bucket's lowest to highest value), faint raw line and smoothed line, drawn
    // straight on the canvas, one path per colour and layer: with hundreds of runs, a uPlot series (or a
    // fill) per run would cost more than the lines it draws. uPlot keeps the axes, zoom and cursor, over
    // the panel's envelope (plotData).
    function drawRuns(panel) {
      return (u) => {
        const { ctx } = u;
        const x = u.data[0];
        const px = x.map((value) => u.valToPos(value, "x", true));
        const byColour = new Map();
        for (const column of panel.columns) {
          if (!byColour.has(column.colour)) byColour.set(column.colour, []);
          byColour.get(column.colour).push(column);
        }
        const line = (columns, key) => {
          const path = new Path2D();
          for (const column of columns) {
            const values = column[key];
            let started = false;
            for (let i = 0; i < x.length; i++) {
              if (values[i] === null) continue;
              const y = u.valToPos(values[i], "y", true);
              if (started) path.lineTo(px[i], y); else { path.moveTo(px[i], y); started = true; }
            }
          }
          return path;
        };
        ctx.save();
        ctx.beginPath();
        ctx.rect(u.bbox.left, u.bbox.top, u.bbox.width, u.bbox.height);
        ctx.clip();
        ctx.lineJoin = "round";
        for (const [colour, columns] of byColour) {
          ctx.fillStyle = colour;
          ctx.strokeStyle = colour;
          if (state.resolution > 1) {
            ctx.globalAlpha = 0.1;
            const bands = new Path2D();
            for (const column of columns) {
              const kept = [];
              for (let i = 0; i < x.length; i++) if (column.high[i] !== null) kept.push(i);
              if (!kept.length) continue;
              bands.moveTo(px[kept[0]], u.valToPos(column.high[kept[0]], "y", true));
              for (const i of kept) bands.lineTo(px[i], u.valToPos(column.high[i], "y", true));
              for (let k = kept.length - 1; k >= 0; k--) bands.lineTo(px[kept[k]], u.valToPos(column.low[kept[k]], "y", true));
              bands.closePath();
            }
            ctx.fill(bands);
          }
          if (view.smoothing > 0) {
            ctx.globalAlpha = 0.3;
            ctx.lineWidth = devicePixelRatio;
            ctx.stroke(line(columns, "raw"));
          }
          ctx.globalAlpha = 1;
          ctx.lineWidth = 1.5 * devicePixelRatio;
          ctx.stroke(line(columns, "smooth"));
        }
        const hovered = panel.columns[panel.hovered];
        if (hovered) {
          ctx.strokeStyle = hovered.colour;
          ctx.lineWidth = 3 * devicePixelRatio;
          ctx.stroke(line([hovered], "smooth"));
        }
        ctx.restore();
      };
    }

    // What uPlot itself holds of a panel: the x grid, and per x the lowest and highest value any run
    // draws there (its scales follow them); the runs' own lines are drawRuns'.
    function plotData(panel) {
      const low = new Array(panel.x.length).fill(null);
      const high = new Array(panel.x.length).fill(null);
      const banded = state.resolution > 1;
      for (const column of panel.columns) {
        for (let i = 0; i < panel.x.length; i++) {
          for (const value of banded ? [column.low[i], column.high[i], column.smooth[i]] : [column.smooth[i], column.raw[i]]) {
            if (value === null || value === undefined) continue;
            if (low[i] === null || value < low[i]) low[i] = value;
            if (high[i] === null || value > high[i]) high[i] = value;
          }
        }
      }
      return [panel.x, low, high];
    }

    // The run whose line is nearest the cursor, named in the panel's caption and drawn thicker.
    function hover(panel, u) {
      const { idx, top } = u.cursor;
      let nearest = -1;
      if (idx !== null && idx !== undefined && top >= 0) {
        let best = 20; // CSS pixels
        panel.columns.forEach((column, i) => {
          const value = column.smooth[idx];
          if (value === null) return;
          const distance = Math.abs(u.valToPos(value, "y") - top);
          if (distance < best) { best = distance; nearest = i; }
        });
      }
      if (nearest === panel.hovered) return;
      panel.hovered = nearest;
      const column = panel.columns[nearest];
      panel.readout.textContent = column
        ? `${column.run.name} #${column.run.id}${view.group ? ` · ${groupOf(column.run)}` : ""}: ${Number(column.smooth[idx].toPrecision(4))}` : "";
      u.redraw(false, false);
    }

    function yRangeOf(name) {
      return (u, min, max) => {
        const logged = view.log.has(name);
        let auto;
        if (min === null || max === null) auto = logged ? [0.1, 10] : [0, 1];
        else if (logged) auto = min === max ? [min / 10, max * 10] : uPlot.rangeLog(min, max, 10, true);
        else auto = charts.yRange(u, min, max);
        const fixed = view.yRanges[name] || [null, null];
        return [fixed[0] ?? auto[0], fixed[1] ?? auto[1]];
      };
    }

    function drawPanel(name) {
      const panel = panelFor(name);
      const { x, index, columns } = panelData(name);
      Object.assign(panel, { x, index, columns });
      if (panel.plot) panel.plot.destroy();
      panel.plot = null;
      panel.empty.hidden = columns.length > 0;
      panel.empty.textContent = state.runs.length ? `None of these runs has logged ${name}.` : "No run matches this view.";
      probe.panels[name] = { runs: columns.length, points: columns.reduce((total, column) => total + column.raw.filter((v) => v !== null).length, 0),
        resolution: state.resolution, colours: columns.map((column) => column.colour) };
      if (!columns.length) return;
      const zoom = view.zoom || [null, null];
      panel.hovered = -1;
      panel.plot = new uPlot({
        width: Math.max(panel.chart.clientWidth, 300),
        height: PANEL_HEIGHT,
        legend: { show: false },
        cursor: { points: { show: false }, drag: { x: interactive, y: false } },
        scales: {
          x: { time: false, ...(zoom[0] !== null || zoom[1] !== null ? { range: (u, min, max) => [zoom[0] ?? min, zoom[1] ?? max] } : {}) },
          y: view.log.has(name) ? { distr: 3, log: 10, range: yRangeOf(name) } : { range: yRangeOf(name) },
        },
        axes: [{ incrs: charts.STEP_INCREMENTS }, {}],
        series: [
          { label: view.x === "rl_step" ? "RL step" : "trainer step" },
          // The envelope: it sets the y scale and draws nothing (drawRuns draws the runs).
          { label: "lowest", stroke: "transparent", width: 0, spanGaps: true, points: { show: false } },
          { label: "highest", stroke: "transparent", width: 0, spanGaps: true, points: { show: false } },
        ],
        hooks: {
          draw: [drawRuns(panel)],
          setCursor: [(u) => hover(panel, u)],
          setSelect: [(u) => {
            if (!interactive || u.select.width < 2) return;
            const from = u.posToVal(u.select.left, "x");
            const to = u.posToVal(u.select.left + u.select.width, "x");
            u.setSelect({ width: 0, height: 0 }, false);
            view.zoom = [Math.floor(from), Math.ceil(to)];
            changed({ reloadSeries: true });
          }],
        },
      }, plotData(panel), panel.chart);
      panel.plot.over.addEventListener("dblclick", () => {
        if (!view.zoom) return;
        view.zoom = null;
        changed({ reloadSeries: true });
      });
    }

    function drawAll() {
      for (const name of [...state.panels.keys()]) if (!view.metrics.includes(name)) destroyPanel(name);
      for (const name of view.metrics) drawPanel(name);
      // Panels in the view's order.
      for (const name of view.metrics) panelsElement.append(state.panels.get(name).figure);
    }

    // -- live

    function onMetrics(message) {
      const run = state.runs.find((candidate) => candidate.id === message.run);
      if (!run) return;
      probe.liveSteps += 1;
      const width = state.resolution;
      const x = width === 1 ? message.step : Math.floor(message.step / width) * width + (width - 1) / 2;
      for (const name of view.metrics) {
        const value = message.values[name];
        if (value === undefined || value === null) continue;
        const columns = ((state.series[name] ||= {})[run.id] ||= { x: [], mean: [], min: [], max: [], count: [] });
        const last = columns.x.length - 1;
        if (last >= 0 && columns.x[last] === x) {
          const count = columns.count[last];
          columns.mean[last] = (columns.mean[last] * count + value) / (count + 1);
          columns.count[last] = count + 1;
          columns.min[last] = Math.min(columns.min[last], value);
          columns.max[last] = Math.max(columns.max[last], value);
        } else if (last < 0 || x > columns.x[last]) {
          columns.x.push(x); columns.mean.push(value); columns.min.push(value); columns.max.push(value); columns.count.push(1);
        } else continue; // a step before the newest bucket (a resumed run trains again): the next load has it
        if (!state.dirty.has(name)) state.dirty.set(name, new Set());
        state.dirty.get(name).add(run);
      }
      if (state.dirty.size && state.frame === null) state.frame = requestAnimationFrame(redrawDirty);
    }

    // A live redraw rebuilds only the columns of the runs that changed, while their buckets are on the
    // panel's grid (a new bucket past it rebuilds the panel's data); hundreds of runs cost one setData.
    function redrawDirty() {
      state.frame = null;
      const started = performance.now();
      for (const [name, changedRuns] of state.dirty) {
        const panel = state.panels.get(name);
        if (!panel) continue;
        const positions = new Map(panel.columns.map((column, i) => [column.run.id, i]));
        const onGrid = panel.plot && [...changedRuns].every((run) => positions.has(run.id)
          && state.series[name][run.id].x.every((x) => panel.index.has(x - xOffset(run))));
        if (onGrid) {
          for (const run of changedRuns) {
            panel.columns[positions.get(run.id)] = runColumn(name, run, panel.x, panel.index);
          }
        } else {
          const { x, index, columns } = panelData(name);
          const sameRuns = panel.plot && columns.length === panel.columns.length
            && columns.every((column, i) => column.run.id === panel.columns[i].run.id);
          if (!sameRuns) { drawPanel(name); continue; }
          Object.assign(panel, { x, index, columns });
        }
        // In a batch, so that uPlot draws now (not in a later microtask) and redrawMs holds the drawing.
        panel.plot.batch(() => panel.plot.setData(plotData(panel), !view.zoom));
      }
      state.dirty.clear();
      probe.redrawMs.push(performance.now() - started);
    }

    if (websocketPath) listen(websocketPath, onMetrics);

    // -- controls and the run table (the workspace page only)

    const controls_ = {};
    const table = { update() {} };
    if (interactive) {
      const form = root.querySelector(".workspace-controls");
      for (const key of ["q", "status", "metrics", "group", "x", "smoothing"]) controls_[key] = form.querySelector(`[name=${key}]`);
      controls_.q.value = view.q;
      controls_.status.value = view.status;
      controls_.metrics.value = view.metrics.join(",");
      controls_.group.value = view.group;
      controls_.x.value = view.x;
      controls_.smoothing.value = String(view.smoothing);
      let searchTimer = null;
      controls_.q.addEventListener("input", () => {
        clearTimeout(searchTimer);
        searchTimer = setTimeout(() => { view.q = controls_.q.value.trim(); changed({ reloadRuns: true }).catch(report); }, 300);
      });
      controls_.status.addEventListener("change", () => { view.status = controls_.status.value; changed({ reloadRuns: true }).catch(report); });
      controls_.metrics.addEventListener("change", () => {
        view.metrics = [...new Set(controls_.metrics.value.split(",").map((part) => part.trim()).filter(Boolean))].slice(0, MAX_METRICS);
        controls_.metrics.value = view.metrics.join(",");
        changed({ reloadSeries: true }).catch(report);
      });
      controls_.group.addEventListener("change", () => { view.group = controls_.group.value.trim(); changed({ reloadRuns: true }).catch(report); });
      controls_.x.addEventListener("change", () => { view.x = controls_.x.value; view.zoom = null; changed({ reloadSeries: true }).catch(report); });
      controls_.smoothing.addEventListener("input", () => { view.smoothing = Number(controls_.smoothing.value); changed({ redraw: true }); });
      root.querySelector(".workspace-reset-zoom").addEventListener("click", () => { view.zoom = null; changed({ reloadSeries: true }).catch(report); });
      form.addEventListener("submit", (event) => event.preventDefault());
      Object.assign(table, runTable(root.querySelector(".workspace-table"), view, () => changed({ reloadRuns: true }).catch(report)));
      const saveForm = root.querySelector(".workspace-save");
      if (saveForm) {
        saveForm.addEventListener("submit", async (event) => {
          event.preventDefault();
          const name = saveForm.querySelector("[name=name]").value.trim();
          const status = saveForm.querySelector(".workspace-save-status");
          const response = await fetch(`${apiBase}/views/`, {
            method: "POST", credentials: "same-origin",
            headers: { "Content-Type": "application/json", Accept: "application/json", "X-CSRFToken": saveForm.querySelector("[name=csrfmiddlewaretoken]").value },
            body: JSON.stringify({ name, query: viewQuery(view, { withViewId: false }), replace: saveForm.querySelector("[name=replace]").checked }),
          });
          const body = await response.json();
          if (!response.ok) { status.textContent = body.error?.message || `HTTP ${response.status}`; status.className = "workspace-save-status error"; return; }
          view.viewId = String(body.id);
          changed();
          probe.saves += 1;
          status.textContent = `Saved as '${body.name}'.`;
          status.className = "workspace-save-status muted";
          const list = root.querySelector(".workspace-views");
          list?.querySelector("#no-saved-views")?.remove();
          if (list && !list.querySelector(`[data-view="${body.id}"]`)) {
            const item = document.createElement("li");
            item.dataset.view = String(body.id);
            const link = document.createElement("a");
            link.href = body.url;
            link.textContent = body.name;
            item.append(link);
            list.append(item);
          }
        });
      }
    }

    function report(error) {
      probe.errors.push(String(error.message || error));
      if (summaryElement) { summaryElement.textContent = String(error.message || error); summaryElement.classList.add("error"); }
    }

    return loadRuns().catch(report);
  }

  // The run table: built-in columns, then the view's config.* and metric.* ones; a header sorts, the row under
  // the headers filters (applied by the platform), "Add column" offers the runs' config keys and metrics.
  function runTable(element, view, reload) {
    const head = element.querySelector("thead");
    const body = element.querySelector("tbody");
    const addInput = document.querySelector(".workspace-add-column input");
    const addForm = document.querySelector(".workspace-add-column");
    const datalist = document.getElementById("workspace-column-keys");
    const duration = (seconds) => (seconds === null ? "" : seconds < 90 ? `${Math.round(seconds)}s` : seconds < 5400 ? `${Math.round(seconds / 60)}m` : `${(seconds / 3600).toFixed(1)}h`);
    const text = (value) => (value === null || value === undefined ? "" : Array.isArray(value) ? value.join(", ")
      : typeof value === "number" ? String(Number(value.toPrecision(6))) : typeof value === "object" ? JSON.stringify(value) : String(value));
    let filterTimer = null;

    addForm.addEventListener("submit", (event) => {
      event.preventDefault();
      const key = addInput.value.trim();
      if (!key || view.columns.includes(key)) return;
      view.columns.push(key);
      addInput.value = "";
      reload();
    });

    function columns() {
      return [...["name", "status", "tags"], ...(view.group ? ["group"] : []), "duration", "step", ...view.columns];
    }

    function update(answer) {
      document.getElementById("workspace-metric-names").replaceChildren(...answer.metric_names.map((name) => new Option(name)));
      document.getElementById("workspace-group-keys").replaceChildren(...["tag", ...answer.config_keys].map((key) => new Option(key)));
      datalist.replaceChildren(...[...answer.config_keys, ...answer.metric_names.map((name) => `metric.${name}`)].map((key) => new Option(key)));
      const keys = columns();
      const titles = document.createElement("tr");
      const filters = document.createElement("tr");
      filters.className = "workspace-filters";
      for (const key of keys) {
        const th = document.createElement("th");
        th.dataset.column = key;
        const sortButton = document.createElement("button");
        sortButton.type = "button";
        sortButton.className = "link workspace-sort";
        const arrow = view.sort === key ? " ▲" : view.sort === `-${key}` ? " ▼" : "";
        sortButton.textContent = (BUILTIN_LABELS[key] || key) + arrow;
        sortButton.title = "Sort by this column";
        sortButton.addEventListener("click", () => { view.sort = view.sort === key ? `-${key}` : key; reload(); });
        th.append(sortButton);
        if (view.columns.includes(key)) {
          const remove = document.createElement("button");
          remove.type = "button";
          remove.className = "link workspace-remove-column";
          remove.textContent = "×";
          remove.title = `Remove the column ${key}`;
          remove.addEventListener("click", () => {
            view.columns = view.columns.filter((column) => column !== key);
            delete view.filters[key];
            if (view.sort.replace(/^-/, "") === key) view.sort = "";
            reload();
          });
          th.append(" ", remove);
        }
        titles.append(th);
        const cell = document.createElement("th");
        const input = document.createElement("input");
        input.type = "search";
        input.className = "workspace-filter";
        input.dataset.column = key;
        input.placeholder = key === "name" || key === "status" || key === "tags" || key === "group" ? "filter" : ">0.5, =x …";
        input.setAttribute("aria-label", `Filter ${key}`);
        input.value = view.filters[key] || "";
        input.addEventListener("input", () => {
          clearTimeout(filterTimer);
          filterTimer = setTimeout(() => {
            if (input.value) view.filters[key] = input.value; else delete view.filters[key];
            reload();
          }, 400);
        });
        cell.append(input);
        filters.append(cell);
      }
      const focused = document.activeElement?.classList.contains("workspace-filter") ? document.activeElement.dataset.column : null;
      head.replaceChildren(titles, filters);
      if (focused) {
        const again = head.querySelector(`.workspace-filter[data-column="${CSS.escape(focused)}"]`);
        again.focus();
        again.setSelectionRange(again.value.length, again.value.length);
      }
      body.replaceChildren(...answer.runs.map((run) => {
        const row = document.createElement("tr");
        row.dataset.run = String(run.id);
        for (const key of keys) {
          const td = document.createElement("td");
          const value = run.values[key];
          if (key === "name") {
            const link = document.createElement("a");
            link.href = `/runs/${run.id}/`;
            link.textContent = `${run.name} #${run.id}`;
            td.append(link);
          } else if (key === "status") {
            const badge = document.createElement("span");
            badge.className = `badge badge-${run.status}`;
            badge.textContent = run.status;
            badge.title = run.status_reason || "";
            td.append(badge);
          } else td.textContent = key === "duration" ? duration(value) : text(value);
          row.append(td);
        }
        return row;
      }));
    }
    return { update };
  }

  // One socket per project, however many workspaces of it the page mounts (a report embeds several).
  const listeners = new Map(); // socket path -> [onMetrics]
  function listen(path, onMetrics) {
    if (!listeners.has(path)) {
      listeners.set(path, []);
      charts.runSocket(path, { socket: null, reconnects: 0 }, {
        onMessage: (message) => {
          if (message.type === "metrics") for (const listener of listeners.get(path)) listener(message);
        },
      });
    }
    listeners.get(path).push(onMetrics);
  }

  window.tandemWorkspaceViews = { parseView, viewQuery };

  for (const root of document.querySelectorAll("[data-workspace]")) {
    mount(root, {
      projectId: root.dataset.project,
      query: root.dataset.query !== undefined ? root.dataset.query : location.search,
      interactive: root.dataset.workspace === "interactive",
      websocketPath: root.dataset.websocketPath,
    });
  }
})();
