// The run timeline: a Gantt of the trainer's recent steps (stage by stage) above the producers'
// episodes, on one time axis, drawn on a canvas from GET /api/runs/<id>/timeline/.
//
// Polls while the run can still train: a cheap poll asks only for the steps after the newest one
// it has (?after_step=), and every FULL_EVERY polls it reloads the whole window, so that a step a
// resumed trainer trained again is redrawn too. Counts of what was drawn are on window.tandemTimeline.
(function () {
  "use strict";

  const root = document.getElementById("timeline-root");
  if (!root) return;
  const POLL_MS = 3000;
  const FULL_EVERY = 20;
  // The statuses in which the run can still train (the contracts': window.tandemContracts), and the
  // trainer's stages: the platform's (telemetry/charts.py).
  const ACTIVE = new Set(window.tandemContracts.run_statuses.active);
  const EPISODE = window.tandemContracts.episode_statuses.by_name; // the contracts' EpisodeStatus
  const STAGES = JSON.parse(document.getElementById("timeline-stages").textContent);
  const STAGE_COLOURS = Object.fromEntries(STAGES.map((stage) => [stage.name, stage.colour]));
  const IDLE_STAGES = new Set(STAGES.filter((stage) => stage.idle).map((stage) => stage.name));
  const EPISODE_COLOURS = { generation: "#3b82f6", environment: "#f59e0b", tool: "#a855f7", rest: "#cbd5e1" };
  const FAILED = "#dc2626";

  // Layout, in CSS pixels.
  const PAD_LEFT = 84;
  const PAD_RIGHT = 12;
  const AXIS_H = 22;
  const STEP_LABEL_H = 14;
  const TRAINER_H = 26;
  const DENSITY_H = 26;
  const LANE_GAP = 16;
  const MAX_PRODUCER_H = 560;
  const GUTTER_LINE_H = 12;
  const COUNT = new Intl.NumberFormat("en");

  const canvas = document.getElementById("timeline-canvas");
  const chart = document.getElementById("timeline-chart");
  const tooltip = document.getElementById("timeline-tooltip");
  const stepsSelect = document.getElementById("timeline-steps");
  const liveBox = document.getElementById("timeline-live");
  const summary = document.getElementById("timeline-summary");
  const emptyNote = document.getElementById("timeline-empty");
  const errorNote = document.getElementById("timeline-error");
  const updated = document.getElementById("timeline-updated");
  const statusBadge = document.getElementById("timeline-status");
  const zoomReset = document.getElementById("timeline-zoom-reset");

  const state = (window.tandemTimeline = {
    polls: 0,
    draws: 0,
    steps: 0,
    stageSegments: 0,
    idleSegments: 0,
    episodeBars: 0,
    failedBars: 0,
    droppedBars: 0,
    episodesBeforeWindow: 0,
    producerRows: 0,
    status: root.dataset.status,
    lastError: null,
  });

  // A label of the left gutter, right-aligned against the plot; kept in `labels` with its
  // horizontal extent, so that tests can see that none is cut off at the canvas's left edge.
  function gutterText(c, labels, text, y, colour) {
    c.textAlign = "right";
    c.fillStyle = colour;
    c.fillText(text, PAD_LEFT - 8, y);
    const width = c.measureText(text).width;
    labels.push({ text, left: PAD_LEFT - 8 - width, right: PAD_LEFT - 8 });
  }

  let steps = new Map(); // step number -> step, from the API
  let hits = []; // what the pointer can hover: {x0, x1, y0, y1, kind, item, step}
  let layout = null;
  let hoveredStep = null;
  let zoom = null; // [start, end] in unix seconds while zoomed in
  let selection = null; // [x where the drag began, x now] while dragging
  let pollsSinceFull = 0;
  let timer = null;

  function wanted() {
    return Number(stepsSelect.value);
  }

  async function load(full) {
    const newest = steps.size ? Math.max(...steps.keys()) : null;
    const query = new URLSearchParams({ last: String(wanted()) });
    if (!full && newest !== null) query.set("after_step", String(newest));
    const response = await fetch(`${root.dataset.timelineUrl}?${query}`, {
      credentials: "same-origin",
      headers: { Accept: "application/json" },
    });
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      throw new Error((body.error && body.error.message) || `HTTP ${response.status}`);
    }
    const body = await response.json();
    if (!full && newest !== null && body.newest_step !== null && body.newest_step < newest) {
      // The run was resumed from an earlier checkpoint: the steps we hold past its newest are gone.
      return load(true);
    }
    if (full) steps = new Map();
    for (const step of body.steps) steps.set(step.step, step);
    // Only the newest `last` steps stay.
    const keep = [...steps.keys()].sort((a, b) => a - b).slice(-wanted());
    steps = new Map(keep.map((number) => [number, steps.get(number)]));
    state.status = body.status;
    statusBadge.textContent = body.status;
    statusBadge.className = `badge badge-${body.status}`;
    document.getElementById("timeline-steps-kept").textContent = String(body.steps_kept);
    // What the trainer waited on, in words (telemetry.selectors.idle_summary).
    const idle = document.getElementById("timeline-idle");
    idle.textContent = body.idle ? body.idle.sentence : "";
    idle.hidden = !body.idle;
    state.polls += 1;
    updated.textContent = `updated ${new Date().toLocaleTimeString()}`;
  }

  async function refresh(full) {
    try {
      await load(full || pollsSinceFull >= FULL_EVERY);
      pollsSinceFull = full || pollsSinceFull >= FULL_EVERY ? 0 : pollsSinceFull + 1;
      errorNote.hidden = true;
      state.lastError = null;
    } catch (error) {
      state.lastError = String(error.message || error);
      errorNote.textContent = `Could not load the timeline: ${state.lastError}`;
      errorNote.hidden = false;
    }
    draw();
  }

  function schedule() {
    clearTimeout(timer);
    if (!liveBox.checked || !ACTIVE.has(state.status)) return;
    timer = setTimeout(async () => {
      if (!document.hidden) await refresh(false);
      schedule();
    }, POLL_MS);
  }

  // --- drawing ----------------------------------------------------------------------------

  function ordered() {
    return [...steps.values()].sort((a, b) => a.step - b.step);
  }

  // Greedy interval packing: each episode goes in the first row free at its start, so
  // concurrent episodes stack and the producer area is as tall as the peak concurrency.
  function pack(episodes, toX) {
    const rowEnds = [];
    const placed = [];
    const sorted = [...episodes].sort((a, b) => a.episode.started_at - b.episode.started_at);
    for (const entry of sorted) {
      const x0 = toX(entry.episode.started_at);
      let row = rowEnds.findIndex((end) => end <= x0 - 1);
      if (row === -1) {
        row = rowEnds.length;
        rowEnds.push(0);
      }
      rowEnds[row] = Math.max(x0 + 1, toX(entry.episode.finished_at));
      placed.push({ ...entry, row });
    }
    return { placed, rows: rowEnds.length };
  }

  function niceStep(seconds, pixels) {
    const target = (seconds / pixels) * 110; // a label every ~110 px
    const choices = [0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600];
    return choices.find((choice) => choice >= target) || 3600;
  }

  function clock(unix, withFraction) {
    const date = new Date(unix * 1000);
    const text = date.toLocaleTimeString([], { hour12: false });
    return withFraction ? `${text}.${String(date.getMilliseconds()).padStart(3, "0")}` : text;
  }

  // Stripes of the idle stage's colour: the trainer sat waiting.
  function hatch(context, colour) {
    const tile = document.createElement("canvas");
    tile.width = tile.height = 8;
    const t = tile.getContext("2d");
    t.fillStyle = "#fff1f2";
    t.fillRect(0, 0, 8, 8);
    t.strokeStyle = colour;
    t.lineWidth = 2;
    t.beginPath();
    t.moveTo(-2, 10);
    t.lineTo(10, -2);
    t.moveTo(-2, 2);
    t.lineTo(2, -2);
    t.moveTo(6, 10);
    t.lineTo(10, 6);
    t.stroke();
    return context.createPattern(tile, "repeat");
  }

  function draw() {
    const list = ordered();
    const width = chart.clientWidth || 1000;
    const counts = {
      steps: list.length, stepsInView: 0, stageSegments: 0, idleSegments: 0, episodeBars: 0, failedBars: 0,
      droppedBars: 0, episodesBeforeWindow: 0, producerRows: 0, zoomed: zoom !== null,
    };
    hits = [];
    emptyNote.hidden = list.length > 0;
    if (!list.length) {
      canvas.style.height = "0px";
      canvas.height = 0;
      Object.assign(state, counts);
      summary.textContent = "";
      state.draws += 1;
      return;
    }
    const windowStart = Math.min(...list.map((step) => step.started_at));
    // What is drawn: the whole window, or the stretch of it the user zoomed into.
    const start = zoom ? zoom[0] : windowStart;
    const end = zoom ? zoom[1] : Math.max(...list.map((step) => step.ended_at));
    const span = Math.max(end - start, 1e-3);
    const plotW = width - PAD_LEFT - PAD_RIGHT;
    const plotEnd = PAD_LEFT + plotW;
    const toX = (t) => PAD_LEFT + ((t - start) / span) * plotW;
    const visible = list.filter((step) => step.ended_at >= start && step.started_at <= end);
    counts.stepsInView = visible.length;

    const episodes = [];
    for (const step of list) {
      for (const episode of step.episodes) {
        if (episode.finished_at < windowStart) counts.episodesBeforeWindow += 1;
        else if (episode.finished_at >= start && episode.started_at <= end) episodes.push({ episode, step: step.step });
      }
    }
    const { placed, rows } = pack(episodes, toX);
    counts.producerRows = rows;
    const rowH = rows ? Math.max(2, Math.min(10, Math.floor(MAX_PRODUCER_H / rows) - 1)) : 10;
    const rowGap = rowH >= 6 ? 2 : rowH >= 3 ? 1 : 0;
    const trainerTop = AXIS_H + STEP_LABEL_H;
    const densityTop = trainerTop + TRAINER_H + LANE_GAP;
    const producerTop = densityTop + DENSITY_H + LANE_GAP;
    // At least as tall as the producers' gutter labels (three lines), however few rows there are.
    const height = producerTop + Math.max(Math.max(rows, 1) * (rowH + rowGap), GUTTER_LINE_H * 3) + 8;
    layout = { start, end, plotW, height };

    const ratio = window.devicePixelRatio || 1;
    canvas.width = Math.round(width * ratio);
    canvas.height = Math.round(height * ratio);
    canvas.style.height = `${height}px`;
    const c = canvas.getContext("2d");
    c.setTransform(ratio, 0, 0, ratio, 0, 0);
    c.clearRect(0, 0, width, height);
    c.font = "11px system-ui, sans-serif";
    c.textBaseline = "middle";

    // Axis: clock times, and grid lines through every lane.
    const tick = niceStep(span, plotW);
    c.strokeStyle = "#eef0f3";
    c.fillStyle = "#6b7280";
    c.lineWidth = 1;
    for (let t = Math.ceil(start / tick) * tick; t <= end; t += tick) {
      const x = Math.round(toX(t)) + 0.5;
      c.beginPath();
      c.moveTo(x, AXIS_H - 4);
      c.lineTo(x, height);
      c.stroke();
      const label = clock(t, tick < 1);
      const half = c.measureText(label).width / 2;
      c.textAlign = "center";
      c.fillText(label, Math.min(Math.max(x, PAD_LEFT + half), width - half - 2), AXIS_H / 2);
    }
    const gutter = [];
    gutterText(c, gutter, "trainer", trainerTop + TRAINER_H / 2, "#374151");
    gutterText(c, gutter, "running", densityTop + DENSITY_H / 2 - 6, "#374151");
    gutterText(c, gutter, "episodes", densityTop + DENSITY_H / 2 + 6, "#9ca3af");
    gutterText(c, gutter, "producers", producerTop + 6, "#374151");
    // The count on a line of its own: "1,680 episodes" is wider than the gutter.
    gutterText(c, gutter, COUNT.format(episodes.length), producerTop + 6 + GUTTER_LINE_H, "#9ca3af");
    gutterText(c, gutter, "episodes", producerTop + 6 + 2 * GUTTER_LINE_H, "#9ca3af");

    // Everything from here on stays inside the plot, however far a zoomed-out bar reaches.
    c.save();
    c.beginPath();
    c.rect(PAD_LEFT, 0, plotW, height);
    c.clip();

    // Trainer lane: each step's stages, idle (waiting for data) hatched.
    const idle = hatch(c, STAGES.find((stage) => stage.idle).colour);
    for (const step of visible) {
      for (const stage of step.stages) {
        const x0 = toX(stage.started_at);
        const x1 = Math.max(toX(stage.ended_at), x0 + 0.5);
        c.fillStyle = IDLE_STAGES.has(stage.name) ? idle : STAGE_COLOURS[stage.name] || "#d1d5db";
        c.fillRect(x0, trainerTop, x1 - x0, TRAINER_H);
        counts.stageSegments += 1;
        if (IDLE_STAGES.has(stage.name)) counts.idleSegments += 1;
        hits.push({ x0: Math.max(x0, PAD_LEFT), x1: Math.min(x1, plotEnd), y0: trainerTop, y1: trainerTop + TRAINER_H,
                    kind: "stage", item: stage, step });
      }
      const sx0 = toX(step.started_at);
      const sx1 = toX(step.ended_at);
      const highlighted = hoveredStep === step.step;
      c.strokeStyle = highlighted ? "#111827" : "#ffffff";
      c.lineWidth = highlighted ? 2 : 1;
      c.strokeRect(sx0 + 0.5, trainerTop + 0.5, Math.max(sx1 - sx0 - 1, 0.5), TRAINER_H - 1);
      if (sx1 - sx0 >= 26) {
        c.fillStyle = "#6b7280";
        c.textAlign = "center";
        c.fillText(String(step.step), (sx0 + sx1) / 2, AXIS_H + STEP_LABEL_H / 2);
      }
    }

    // How many episodes were running over time: a gap in it is the producers standing idle.
    const columns = Math.max(1, Math.floor(plotW));
    const running = new Float32Array(columns);
    for (const { episode } of placed) {
      const a = Math.max(0, Math.floor(toX(episode.started_at) - PAD_LEFT));
      const b = Math.min(columns - 1, Math.floor(toX(episode.finished_at) - PAD_LEFT));
      for (let x = a; x <= b; x++) running[x] += 1;
    }
    const peak = Math.max(1, ...running);
    c.fillStyle = "#f3f4f6";
    c.fillRect(PAD_LEFT, densityTop, plotW, DENSITY_H);
    c.fillStyle = "#60a5fa";
    for (let x = 0; x < columns; x++) {
      if (!running[x]) continue;
      const h = (running[x] / peak) * DENSITY_H;
      c.fillRect(PAD_LEFT + x, densityTop + DENSITY_H - h, 1, h);
    }

    // Step boundaries through the producer lanes: which episodes ran while which step trained.
    c.strokeStyle = "#d1d5db";
    c.setLineDash([2, 3]);
    c.lineWidth = 1;
    for (const step of visible) {
      const x = Math.round(toX(step.started_at)) + 0.5;
      c.beginPath();
      c.moveTo(x, densityTop);
      c.lineTo(x, height);
      c.stroke();
    }
    c.setLineDash([]);

    // Producer area: one bar per episode.
    for (const { episode, step, row } of placed) {
      const y = producerTop + row * (rowH + rowGap);
      const x0 = Math.max(toX(episode.started_at), PAD_LEFT);
      const x1 = Math.min(Math.max(toX(episode.finished_at), x0 + 1), plotEnd);
      const wall = Math.max(episode.finished_at - episode.started_at, 1e-9);
      const dropped = episode.outcome.startsWith("dropped");
      const dimmed = hoveredStep !== null && hoveredStep !== step;
      c.globalAlpha = dimmed ? 0.15 : dropped ? 0.45 : 1;
      // The shares of its time, in one order: generation, environment, tool, the rest.
      const shares = [
        ["generation", episode.generation_s],
        ["environment", episode.environment_s],
        ["tool", episode.tool_s],
      ];
      const full = toX(episode.finished_at) - toX(episode.started_at);
      let x = toX(episode.started_at);
      c.fillStyle = EPISODE_COLOURS.rest;
      c.fillRect(x0, y, x1 - x0, rowH);
      for (const [name, seconds] of shares) {
        const w = (Math.max(seconds, 0) / wall) * full;
        const a = Math.max(x, PAD_LEFT);
        const b = Math.min(x + w, x1);
        if (b > a) {
          c.fillStyle = EPISODE_COLOURS[name];
          c.fillRect(a, y, b - a, rowH);
        }
        x += w;
      }
      if (episode.status === EPISODE.FAILED) {
        c.strokeStyle = FAILED;
        c.lineWidth = rowH >= 4 ? 2 : 1;
        c.strokeRect(x0 + 0.5, y + 0.5, Math.max(x1 - x0 - 1, 1), Math.max(rowH - 1, 1));
        c.fillStyle = FAILED;
        c.fillRect(x1 - Math.min(4, x1 - x0), y, Math.min(4, x1 - x0), rowH);
        counts.failedBars += 1;
      } else if (dropped) {
        c.setLineDash([3, 2]);
        c.strokeStyle = "#475569";
        c.lineWidth = 1;
        c.strokeRect(x0 + 0.5, y + 0.5, Math.max(x1 - x0 - 1, 1), Math.max(rowH - 1, 1));
        c.setLineDash([]);
      }
      if (dropped) counts.droppedBars += 1;
      if (toX(episode.started_at) < PAD_LEFT) {
        // Started before the window: a notch says the bar goes on to the left.
        c.fillStyle = "#374151";
        c.fillRect(PAD_LEFT, y, 2, rowH);
      }
      c.globalAlpha = 1;
      counts.episodeBars += 1;
      hits.push({ x0, x1, y0: y, y1: y + rowH + rowGap, kind: "episode", item: episode, step });
    }
    if (selection) {
      const [a, b] = [Math.min(...selection), Math.max(...selection)];
      c.fillStyle = "rgba(37, 99, 235, 0.12)";
      c.fillRect(a, 0, b - a, height);
      c.strokeStyle = "#2563eb";
      c.strokeRect(a + 0.5, 0.5, b - a - 1, height - 1);
    }
    c.restore();
    gutterText(c, gutter, `(peak ${COUNT.format(peak)})`, densityTop + DENSITY_H / 2 + 18, "#9ca3af");
    zoomReset.hidden = zoom === null;
    Object.assign(state, counts, { gutter });
    state.draws += 1;
    summarise(visible, episodes, counts);
  }

  function summarise(list, episodes, counts) {
    if (!list.length) {
      summary.textContent = "No step in this stretch: double-click to see the whole window.";
      return;
    }
    let wall = 0;
    let idle = 0;
    for (const step of list) {
      wall += step.ended_at - step.started_at;
      for (const stage of step.stages) if (IDLE_STAGES.has(stage.name)) idle += stage.ended_at - stage.started_at;
    }
    const outcomes = {};
    for (const { episode } of episodes) outcomes[episode.outcome] = (outcomes[episode.outcome] || 0) + 1;
    // Built as nodes, never as HTML: nothing the API sends is markup.
    const strong = (text) => {
      const node = document.createElement("strong");
      node.textContent = text;
      return node;
    };
    const parts = [
      [strong(String(list.length)), ` steps (${list[0].step}–${list[list.length - 1].step}) over ${wall.toFixed(1)} s`],
      ["trainer idle ", strong(`${wall > 0 ? ((100 * idle) / wall).toFixed(0) : 0}%`), " waiting for data"],
      [strong(String(episodes.length)), " episodes" +
        (counts.episodesBeforeWindow ? ` (and ${counts.episodesBeforeWindow} that ended before the window)` : "")],
    ];
    const named = Object.entries(outcomes).map(([name, count]) => `${count} ${name.replace("_", " ")}`);
    if (named.length) parts.push([named.join(", ")]);
    summary.replaceChildren(...parts.flatMap((part, index) => (index ? [" · ", ...part] : part)));
  }

  // --- hover --------------------------------------------------------------------------------

  function seconds(value) {
    return value >= 10 ? `${value.toFixed(1)} s` : value >= 0.1 ? `${value.toFixed(2)} s` : `${(value * 1000).toFixed(1)} ms`;
  }

  function describe(hit) {
    if (hit.kind === "stage") {
      const stage = hit.item;
      const step = hit.step;
      return [
        `step ${step.step} (${step.phase}, policy v${step.policy_version}): ${seconds(step.ended_at - step.started_at)}`,
        `${stage.name}${IDLE_STAGES.has(stage.name) ? " (idle, waiting for trajectories)" : ""}: ${seconds(stage.ended_at - stage.started_at)}`,
        `${clock(stage.started_at, true)} → ${clock(stage.ended_at, true)}`,
        `${step.episodes.length} episodes consumed`,
      ].join("\n");
    }
    const e = hit.item;
    const wall = e.finished_at - e.started_at;
    const versions = e.policy_version === e.newest_policy_version ? `v${e.policy_version}` : `v${e.policy_version}–v${e.newest_policy_version}`;
    return [
      `episode ${e.trajectory_id.slice(0, 12)} · group ${e.group_id}`,
      `${e.environment} · ${e.status}${e.failure_reason ? `: ${e.failure_reason}` : ""}`,
      `${e.outcome.replace("_", " ")} in step ${hit.step} · reward ${e.reward === null ? "—" : e.reward}`,
      `${seconds(wall)}: generation ${seconds(e.generation_s)}, environment ${seconds(e.environment_s)}, tool ${seconds(e.tool_s)}`,
      `policy ${versions} · ${clock(e.started_at, true)} → ${clock(e.finished_at, true)}`,
    ].join("\n");
  }

  function pointer(event) {
    const box = canvas.getBoundingClientRect();
    return [event.clientX - box.left, event.clientY - box.top, box];
  }

  function timeAt(x) {
    return layout.start + ((x - PAD_LEFT) / layout.plotW) * (layout.end - layout.start);
  }

  // Drag across the chart to zoom into that stretch; double-click (or the button) to see it all.
  canvas.addEventListener("mousedown", (event) => {
    const [x] = pointer(event);
    if (!layout || x < PAD_LEFT) return;
    selection = [x, x];
    hoveredStep = null;
  });
  window.addEventListener("mouseup", () => {
    if (!selection) return;
    const [a, b] = [Math.min(...selection), Math.max(...selection)];
    selection = null;
    if (b - a >= 6) zoom = [timeAt(a), timeAt(b)];
    draw();
  });
  function unzoom() {
    zoom = null;
    draw();
  }
  canvas.addEventListener("dblclick", unzoom);
  zoomReset.addEventListener("click", unzoom);

  canvas.addEventListener("mousemove", (event) => {
    const [x, y, box] = pointer(event);
    if (selection) {
      selection[1] = Math.min(Math.max(x, PAD_LEFT), PAD_LEFT + layout.plotW);
      tooltip.hidden = true;
      draw();
      return;
    }
    const hit = hits.find((h) => x >= h.x0 && x <= h.x1 && y >= h.y0 && y <= h.y1);
    const step = hit && hit.kind === "stage" ? hit.step.step : null;
    if (step !== hoveredStep) {
      hoveredStep = step;
      draw();
    }
    if (!hit) {
      tooltip.hidden = true;
      return;
    }
    tooltip.textContent = describe(hit);
    tooltip.hidden = false;
    const left = Math.min(x + 14, box.width - tooltip.offsetWidth - 4);
    tooltip.style.left = `${Math.max(left, 0)}px`;
    tooltip.style.top = `${y + 16}px`;
  });
  canvas.addEventListener("mouseleave", () => {
    tooltip.hidden = true;
    if (hoveredStep !== null) {
      hoveredStep = null;
      draw();
    }
  });

  stepsSelect.addEventListener("change", async () => {
    await refresh(true);
    schedule();
  });
  liveBox.addEventListener("change", schedule);
  window.addEventListener("resize", () => draw());

  refresh(true).then(schedule);
})();
