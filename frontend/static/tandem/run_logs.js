// The run page's Logs panel, and a failed run's traceback beside its status reason.
//
// REST is the record: the panel shows the newest lines (/api/runs/<id>/logs/), then asks
// for the lines after its cursor whenever the run's WebSocket says new ones were stored
// (a compact "logs" notice, no lines in it) and whenever the socket (re)opens. A flood of
// logs cannot freeze the page: fetches never overlap (notices arriving meanwhile make one
// more fetch), lines are drawn at most once per animation frame, and the DOM keeps only
// the newest MAX_LINES lines.
(function () {
  "use strict";
  const panel = document.getElementById("run-logs");
  if (!panel) return;

  const MAX_LINES = 3000; // lines the DOM keeps; older ones are dropped from the view (not the record)
  const TAIL_LINES = 500; // lines a (re)load shows first
  const PAGE_LINES = 1000; // lines one catch-up fetch asks for
  const FAILURE_TAIL_LINES = 20;
  const SEARCH_DEBOUNCE_MS = 300;
  const { FAILED } = window.tandemContracts.run_statuses.by_name; // the contracts' RunStatus.FAILED

  const logsUrl = panel.dataset.logsUrl;
  const websocketPath = panel.dataset.websocketPath;
  const el = {
    lines: document.getElementById("run-logs-lines"),
    empty: document.getElementById("run-logs-empty"),
    notice: document.getElementById("run-logs-notice"),
    level: document.getElementById("run-logs-level"),
    process: document.getElementById("run-logs-process"),
    search: document.getElementById("run-logs-search"),
    loggers: document.getElementById("run-logs-loggers"),
    loggerList: document.getElementById("run-logs-logger-list"),
    hiddenCount: document.getElementById("run-logs-hidden-count"),
    follow: document.getElementById("run-logs-follow"),
    download: document.getElementById("run-logs-download"),
    failure: document.getElementById("run-failure-logs"),
    failureTraceback: document.getElementById("run-failure-traceback"),
    failureTail: document.getElementById("run-failure-tail"),
  };

  // What browser tests (and curious people in the console) can read.
  const state = (window.tandemRunLogs = {
    status: panel.dataset.status,
    cursor: null, // id of the newest line received for the current filters
    shown: 0, // lines in the DOM now
    received: 0, // lines received for the current filters, over every fetch
    fetches: 0,
    notices: 0, // "logs" messages from the socket
    redraws: 0, // coalesced: far fewer than lines when they flood in
    failureShown: false,
    socket: null,
    reconnects: 0,
  });

  let generation = 0; // bumped by a filter change: answers to older fetches are dropped
  let fetching = false;
  let fetchAgain = false;
  let pending = []; // lines fetched, not drawn yet
  let drawScheduled = false;
  let resetView = false;

  function query(params) {
    const search = new URLSearchParams(params);
    if (el.level.value) search.set("level", el.level.value);
    if (el.process.value) search.set("process", el.process.value);
    const text = el.search.value.trim();
    if (text) search.set("q", text);
    for (const logger of hiddenLoggers) search.append("hide", logger);
    return `${logsUrl}?${search}`;
  }

  // Loggers the reader unticked: their lines (and their children's) are left out by the API.
  const hiddenLoggers = new Set();

  async function showLoggers() {
    const loggers = await getJson(el.loggers.dataset.loggersUrl);
    el.loggerList.replaceChildren(...loggers.map(({ logger, lines }) => {
      const box = document.createElement("input");
      box.type = "checkbox";
      box.checked = !hiddenLoggers.has(logger);
      box.dataset.logger = logger;
      box.addEventListener("change", () => {
        if (box.checked) hiddenLoggers.delete(logger);
        else hiddenLoggers.add(logger);
        el.hiddenCount.textContent = hiddenLoggers.size ? `(${hiddenLoggers.size} hidden)` : "";
        filtersChanged();
      });
      const label = document.createElement("label");
      label.className = "run-logs-logger";
      label.append(box, ` ${logger || "(root)"} `, span("muted", `${lines} line${lines === 1 ? "" : "s"}`));
      return label;
    }));
  }

  async function getJson(url) {
    const response = await fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" });
    if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
    return response.json();
  }

  function showCounts(page) {
    const parts = [];
    if (page.lines_deleted) {
      parts.push(`${page.lines_deleted.toLocaleString()} older lines were deleted to keep this run under the ` +
                 `operator's cap (${page.lines_kept.toLocaleString()} kept).`);
    }
    if (page.lines_lost) {
      parts.push(`${page.lines_lost.toLocaleString()} lines never reached the platform (trimmed from the run's stream).`);
    }
    el.notice.textContent = parts.join(" ");
    el.notice.hidden = parts.length === 0;
  }

  // --- fetching -------------------------------------------------------------

  async function reload() {
    const mine = ++generation;
    fetching = true;
    try {
      const page = await getJson(query({ limit: TAIL_LINES }));
      if (mine !== generation) return;
      state.fetches += 1;
      state.cursor = page.next_after;
      state.received = page.lines.length;
      showCounts(page);
      pending = page.lines;
      resetView = true;
      scheduleDraw();
    } finally {
      if (mine === generation) fetching = false;
    }
    if (fetchAgain) fetchNewer();
  }

  // The lines after the cursor, page after page; a call while one runs makes one more run after it.
  async function fetchNewer() {
    if (fetching) {
      fetchAgain = true;
      return;
    }
    if (state.cursor === null) return reload();
    fetching = true;
    fetchAgain = false;
    const mine = generation;
    try {
      let more = true;
      while (more && mine === generation) {
        const page = await getJson(query({ after: state.cursor, limit: PAGE_LINES }));
        if (mine !== generation) return;
        state.fetches += 1;
        showCounts(page);
        if (page.lines.length) {
          state.cursor = page.next_after;
          state.received += page.lines.length;
          pending.push(...page.lines);
          if (pending.length > MAX_LINES) pending = pending.slice(-MAX_LINES);
          scheduleDraw();
        }
        more = page.has_more;
      }
    } finally {
      if (mine === generation) fetching = false;
    }
    if (fetchAgain && mine === generation) fetchNewer();
  }

  // --- drawing --------------------------------------------------------------

  function span(className, text) {
    const node = document.createElement("span");
    node.className = className;
    node.textContent = text;
    return node;
  }

  function lineNode(line) {
    const node = document.createElement("div");
    const level = line.level.toLowerCase();
    node.className = `run-log-line level-${level}`;
    node.dataset.lineId = line.id;
    node.dataset.level = level;
    node.append(
      span("run-log-time", new Date(line.logged_at).toLocaleTimeString()), " ",
      span("run-log-level", line.level), " ",
      span("run-log-process", `${line.role} ${line.hostname}:${line.pid}`), " ",
      span("run-log-logger", line.logger), " ",
      span("run-log-message", line.message),
    );
    if (line.traceback) {
      const details = document.createElement("details");
      const summary = document.createElement("summary");
      summary.textContent = "traceback";
      const pre = document.createElement("pre");
      pre.className = "run-log-traceback";
      pre.textContent = line.traceback;
      details.append(summary, pre);
      node.append(details);
    }
    return node;
  }

  function scheduleDraw() {
    if (drawScheduled) return;
    drawScheduled = true;
    window.requestAnimationFrame(draw);
  }

  function draw() {
    drawScheduled = false;
    state.redraws += 1;
    const box = el.lines;
    const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 24;
    if (resetView) {
      box.replaceChildren();
      resetView = false;
    }
    const fragment = document.createDocumentFragment();
    for (const line of pending.slice(-MAX_LINES)) fragment.append(lineNode(line));
    pending = [];
    box.append(fragment);
    while (box.childElementCount > MAX_LINES) box.firstElementChild.remove();
    state.shown = box.childElementCount;
    el.empty.hidden = state.shown > 0;
    if (el.follow.checked || atBottom) box.scrollTop = box.scrollHeight;
  }

  // --- a failed run's traceback and last lines ------------------------------

  async function showFailure() {
    if (state.status !== FAILED || !el.failure) return;
    const base = `${logsUrl}?`;
    const [errors, tail] = await Promise.all([
      getJson(`${base}${new URLSearchParams({ level: "error", limit: 50 })}`),
      getJson(`${base}${new URLSearchParams({ limit: FAILURE_TAIL_LINES })}`),
    ]);
    const failing = errors.lines.filter((line) => line.traceback).pop();
    el.failureTraceback.textContent = failing ? `${failing.message}\n\n${failing.traceback}` : "";
    el.failureTraceback.hidden = !failing;
    el.failureTail.textContent = tail.lines
      .map((line) => `${new Date(line.logged_at).toLocaleTimeString()} ${line.level} ${line.role} ` +
                     `${line.hostname}:${line.pid} ${line.logger}: ${line.message}`)
      .join("\n");
    el.failure.hidden = tail.lines.length === 0;
    state.failureShown = !el.failure.hidden;
  }

  // --- the run's socket: a notifier ----------------------------------------

  // The loop that keeps it open is the dashboard's one (charts.js).
  function connect() {
    window.tandemCharts.runSocket(websocketPath, state, {
      onOpen: () => fetchNewer().catch(console.error), // what was stored while we were away
      onMessage: (message) => {
        if (message.type === "logs") {
          state.notices += 1;
          fetchNewer().catch(console.error);
          if (state.status === FAILED) showFailure().catch(console.error);
        } else if (message.type === "status" && message.status !== state.status) {
          state.status = message.status;
          if (state.status === FAILED) showFailure().catch(console.error);
        }
      },
    });
  }

  let searchTimer = null;
  function filtersChanged() {
    clearTimeout(searchTimer);
    state.cursor = null;
    reload().catch(console.error);
  }
  el.loggers.addEventListener("toggle", () => {
    if (el.loggers.open) showLoggers().catch(console.error);
  });
  el.level.addEventListener("change", filtersChanged);
  el.process.addEventListener("change", filtersChanged);
  el.search.addEventListener("input", () => {
    clearTimeout(searchTimer);
    searchTimer = setTimeout(filtersChanged, SEARCH_DEBOUNCE_MS);
  });
  el.follow.addEventListener("change", () => {
    if (el.follow.checked) el.lines.scrollTop = el.lines.scrollHeight;
  });

  reload()
    .catch(console.error)
    .finally(() => {
      showFailure().catch(console.error);
      connect(); // an ended run's producers may still log for a while
    });
})();
