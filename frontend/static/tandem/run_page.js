// Live charts of one run.
//
// History comes from the REST API, paged by a step cursor; the WebSocket only
// tells us about new steps and may drop messages. So: backfill, open the
// socket, and on every (re)connect backfill again from the REST cursor. Steps
// already drawn are skipped, so overlap between the two is harmless.
(function () {
  "use strict";

  const root = document.getElementById("run-root");
  if (!root) return;

  const TERMINAL = new Set(["finished", "failed", "cancelled"]);
  const PAGE_LIMIT = 5000;
  const RETRY_MIN_MS = 1000;
  const RETRY_MAX_MS = 15000;

  const CHARTS = [
    {
      id: "chart-reward",
      series: [
        { name: "reward_mean", label: "reward mean", stroke: "#2563eb" },
        { name: "success_rate", label: "success rate", stroke: "#16a34a" },
      ],
    },
    { id: "chart-loss", series: [{ name: "loss", label: "loss", stroke: "#dc2626" }] },
    {
      id: "chart-idle",
      range: [0, 1],
      series: [{ name: "trainer_idle_fraction", label: "idle fraction", stroke: "#9333ea" }],
    },
  ];
  const CHARTED = CHARTS.flatMap((chart) => chart.series.map((series) => series.name));

  const metricsUrl = root.dataset.metricsUrl;
  const runUrl = root.dataset.runUrl;
  const websocketPath = root.dataset.websocketPath;
  const actionsByStatus = JSON.parse(root.dataset.actions || "{}");
  const el = {
    status: document.getElementById("run-status"),
    statusReason: document.getElementById("run-status-reason"),
    step: document.getElementById("run-step"),
    policyVersion: document.getElementById("run-policy-version"),
    connection: document.getElementById("run-connection"),
    cancelForm: document.getElementById("cancel-form"),
  };

  // What browser tests (and curious people in the console) can read.
  const page = (window.tandemRunPage = {
    pointCount: 0, // metric points received, over REST and WebSocket, each counted once
    lastStep: -1, // highest step received
    policyVersion: -1, // newest policy version shown
    status: root.dataset.status,
    reconnects: 0,
    socket: null,
  });

  // Column-oriented data, as uPlot wants it: steps ascending, one array per series.
  const steps = [];
  const seenSteps = new Set();
  const columns = Object.fromEntries(CHARTED.map((name) => [name, []]));
  let restCursor = -1; // last step the REST API returned: everything up to it is drawn

  function ingestStep(step, values) {
    if (seenSteps.has(step)) return;
    seenSteps.add(step);
    let index = steps.length;
    if (index > 0 && steps[index - 1] > step) index = lowerBound(steps, step);
    steps.splice(index, 0, step);
    for (const name of CHARTED) {
      const value = values[name];
      columns[name].splice(index, 0, value === undefined ? null : value);
    }
    page.pointCount += Object.keys(values).length;
    if (step > page.lastStep) {
      page.lastStep = step;
      el.step.textContent = String(step);
      // Points that arrive by backfill (not the socket) carry the version too.
      if (values.policy_version !== undefined) showRun({ policy_version: values.policy_version });
    }
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

  // --- charts -------------------------------------------------------------

  const charts = CHARTS.map((spec) => {
    const container = document.getElementById(spec.id);
    const plot = new uPlot(
      {
        width: chartWidth(container),
        height: 220,
        scales: { x: { time: false }, y: spec.range ? { range: spec.range } : {} },
        series: [
          { label: "step" },
          ...spec.series.map((series) => ({
            label: series.label,
            stroke: series.stroke,
            width: 2,
            spanGaps: true,
            points: { show: false },
          })),
        ],
        axes: [{ label: "step" }, {}],
        legend: { live: true },
      },
      [steps, ...spec.series.map((series) => columns[series.name])],
      container,
    );
    return { spec, container, plot };
  });

  function chartWidth(container) {
    return Math.max(container.clientWidth, 300);
  }

  let redrawPending = false;
  function scheduleRedraw() {
    if (redrawPending) return;
    redrawPending = true;
    requestAnimationFrame(() => {
      redrawPending = false;
      for (const { spec, plot } of charts) {
        plot.setData([steps, ...spec.series.map((series) => columns[series.name])]);
      }
    });
  }

  window.addEventListener("resize", () => {
    for (const { container, plot } of charts) {
      plot.setSize({ width: chartWidth(container), height: 220 });
    }
  });

  // --- status -------------------------------------------------------------

  function showRun(update) {
    // An ended run does not come back to life because of a stale REST answer.
    const ended = TERMINAL.has(page.status) && !TERMINAL.has(update.status);
    if (update.status && update.status !== page.status && !ended) {
      page.status = update.status;
      el.status.textContent = update.status;
      el.status.className = `badge badge-${update.status}`;
      if (TERMINAL.has(update.status) && el.cancelForm) el.cancelForm.remove();
      // Only the actions the new status admits stay on offer (the server decided per status).
      const offered = actionsByStatus[update.status] || [];
      for (const form of document.querySelectorAll("#run-actions form[data-action]")) {
        form.hidden = !offered.includes(form.dataset.action);
      }
    }
    if (update.status_reason !== undefined) el.statusReason.textContent = update.status_reason;
    // Versions only grow: a REST answer that left before a socket message must not
    // put an older version back on screen.
    const version = update.policy_version;
    if (version !== undefined && version !== null && !(version < page.policyVersion)) {
      page.policyVersion = version;
      el.policyVersion.textContent = String(version);
    }
  }

  function showConnection(text) {
    el.connection.textContent = text;
  }

  async function refreshRun() {
    const response = await fetch(runUrl, { credentials: "same-origin", headers: { Accept: "application/json" } });
    if (response.ok) showRun(await response.json());
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

  async function drainMetrics() {
    for (;;) {
      const url = `${metricsUrl}?after_step=${restCursor}&limit=${PAGE_LIMIT}`;
      const response = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
      if (!response.ok) throw new Error(`metrics backfill failed: HTTP ${response.status}`);
      const body = await response.json();
      if (body.points.length === 0) return;
      let step = null;
      let values = {};
      for (const point of body.points) {
        if (point.step !== step) {
          if (step !== null) ingestStep(step, values);
          step = point.step;
          values = {};
        }
        values[point.name] = point.value;
      }
      ingestStep(step, values);
      restCursor = body.next_after_step;
    }
  }

  // --- WebSocket ----------------------------------------------------------

  let retryMs = RETRY_MIN_MS;

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
    });

    socket.addEventListener("message", (event) => {
      const message = JSON.parse(event.data);
      if (message.type === "metrics") {
        ingestStep(message.step, message.values);
        showRun({ status: message.status, policy_version: message.policy_version });
      } else if (message.type === "status") {
        showRun(message);
      }
    });

    socket.addEventListener("close", () => {
      if (page.socket !== socket) return;
      page.socket = null;
      if (TERMINAL.has(page.status)) {
        showConnection(`run ${page.status}`);
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

  backfill()
    .catch(console.error)
    .finally(connect);
})();
