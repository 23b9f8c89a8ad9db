// The run page's Evaluations table (see data.js): a row per evaluation, upserted as they come,
// and the evaluation charts' points.
(function () {
  "use strict";

  const rp = window.tandemRunPageParts;
  if (!rp) return;
  const { root, evaluationsUrl, isEvaluationSeries, ingestEvaluationPoints } = rp;

  // The series of the run's evaluations, as evaluations.services.evaluation_series_name names them:
  // <prefix><metric> for its own environment's, <prefix><name@version>/<metric> for another environment's,
  // <prefix>dataset:<name@version>/<metric> for a dataset's; a label past 32 characters is cut with a
  // hash, which the platform sends as series_label. The prefix is the contracts' (window.tandemContracts).
  const EVALUATION_SERIES_PREFIX = window.tandemContracts.evaluation_metrics.series_prefix;
  function evaluationSeriesPrefix(evaluation) {
    if (evaluation.kind === "dataset" || evaluation.environment !== root.dataset.environmentLabel) {
      return `${EVALUATION_SERIES_PREFIX}${evaluation.series_label}/`;
    }
    return EVALUATION_SERIES_PREFIX;
  }

  // The table's metric columns as runs/pages.py (_evaluation_table) orders and labels them, from the
  // contracts (window.tandemContracts): the leading metrics (tandem.contracts.EVALUATION_LEADING_METRICS),
  // a column per pass@k by k, then the tool-use metrics (EVALUATION_TOOL_METRICS) and a dataset's
  // held-out metrics (DATASET_EVALUATION_METRICS), each only once some evaluation has it; labelled as
  // evaluation_metric_label labels them.
  const EVALUATION_VOCABULARY = window.tandemContracts.evaluation_metrics;
  const EVALUATION_LEADING_METRICS = EVALUATION_VOCABULARY.leading;
  const PASS_AT_K = /^pass@(\d+)$/;
  const EVALUATION_TOOL_METRICS = EVALUATION_VOCABULARY.tools;
  const DATASET_EVALUATION_METRICS = EVALUATION_VOCABULARY.dataset;
  const EVALUATION_FIXED_COLUMNS = ["#", "Step", "Policy version", "Environment", "Status", "Episodes"];

  function evaluationColumnLabel(name) {
    return EVALUATION_VOCABULARY.labels[name] ?? name;
  }

  // Where a metric's column goes: [group, position in it]; null for a metric the table leaves out.
  function evaluationColumnOrder(name) {
    if (EVALUATION_LEADING_METRICS.includes(name)) return [0, EVALUATION_LEADING_METRICS.indexOf(name)];
    const passAtK = PASS_AT_K.exec(name);
    if (passAtK) return [1, Number(passAtK[1])];
    if (EVALUATION_TOOL_METRICS.includes(name)) return [2, EVALUATION_TOOL_METRICS.indexOf(name)];
    if (DATASET_EVALUATION_METRICS.includes(name)) return [3, DATASET_EVALUATION_METRICS.indexOf(name)];
    return null;
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
    const known = [...EVALUATION_LEADING_METRICS, ...Object.keys(metrics), ...EVALUATION_TOOL_METRICS,
                   ...DATASET_EVALUATION_METRICS];
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

  Object.assign(rp, { showEvaluation, backfillEvaluations });
})();
