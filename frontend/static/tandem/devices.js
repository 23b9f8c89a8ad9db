// The devices page: a table of devices per active run, drawn from /api/devices/, and a table of every
// Tandem process, drawn from /api/processes/; both redrawn every few seconds. The "Over time" section's
// charts of one picked run are metric_explorer.js's (fixed panels); this script only submits its picker.
//
// Polling one endpoint for every run (not a WebSocket per run): the trainer
// reports devices every device_report_interval_s, and processes report every
// few seconds, so a few seconds is fresh enough.
(function () {
  "use strict";

  const root = document.getElementById("devices-root");
  if (!root) return;
  // Picking another run shows its charts at once (the form's own button does the same without JavaScript).
  const historyPicker = document.getElementById("device-history-run");
  if (historyPicker) historyPicker.addEventListener("change", () => historyPicker.form.submit());
  const container = document.getElementById("device-runs");
  const empty = document.getElementById("devices-empty");
  const updated = document.getElementById("devices-updated");
  const processesRoot = document.getElementById("processes-root");
  const processesContainer = document.getElementById("processes");
  const REFRESH_MS = Number(root.dataset.refreshMs) || 5000;
  const NOT_REPORTED = "not reported";
  const state = (window.tandemDevices = { polls: 0, draws: 0 });

  function el(tag, attributes, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes || {})) {
      if (name === "class") node.className = value;
      else if (name === "dataset") Object.assign(node.dataset, value);
      else node.setAttribute(name, value);
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  const missing = (value) => value === null || value === undefined;

  function bytes(value) {
    if (missing(value)) return NOT_REPORTED;
    const gib = value / 2 ** 30;
    if (gib >= 1) return `${gib.toFixed(gib >= 100 ? 0 : 1)} GiB`;
    return `${(value / 2 ** 20).toFixed(0)} MiB`;
  }

  const percent = (share) => (missing(share) ? NOT_REPORTED : `${(share * 100).toFixed(1)}%`);

  function ago(unixSeconds) {
    if (missing(unixSeconds)) return "";
    const seconds = Math.max(0, Date.now() / 1000 - unixSeconds);
    if (seconds < 90) return `${Math.round(seconds)} s ago`;
    if (seconds < 5400) return `${Math.round(seconds / 60)} min ago`;
    return `${Math.round(seconds / 3600)} h ago`;
  }

  // A share 0-1 as a bar with its figure; "not reported" and no bar when absent.
  function bar(share, className) {
    const cell = el("td", { class: className });
    if (missing(share)) {
      cell.append(el("span", { class: "muted not-reported" }, NOT_REPORTED));
      return cell;
    }
    cell.append(meter(share), el("span", { class: "meter-value" }, percent(share)));
    return cell;
  }

  function figure(label, value) {
    const dd = el("dd", {}, value);
    if (value === NOT_REPORTED) dd.className = "muted not-reported";
    return el("div", {}, el("dt", {}, label), dd);
  }

  function meter(share) {
    const fill = el("span", { class: "meter-fill" });
    fill.style.width = `${Math.min(Math.max(share, 0), 1) * 100}%`;
    return el("span", { class: "meter" }, fill);
  }

  // In use, with a bar against the limit; peak and limit beneath.
  function memoryCell(device) {
    const cell = el("td", { class: "device-memory" });
    const inUse = device.memory_in_use_bytes, peak = device.memory_peak_bytes, limit = device.memory_limit_bytes;
    if (missing(inUse) && missing(peak) && missing(limit)) {
      cell.append(el("span", { class: "muted not-reported" }, NOT_REPORTED));
      return cell;
    }
    cell.append(el("div", { class: "memory-in-use" }, !missing(inUse) && limit ? meter(inUse / limit) : null,
      `${bytes(inUse)} in use`));
    cell.append(el("div", { class: "muted small memory-peak-limit" }, `peak ${bytes(peak)} · limit ${bytes(limit)}`));
    return cell;
  }

  // The driver's own view: NVML on NVIDIA GPUs, libtpu on TPUs; nothing elsewhere.
  function driverCell(device) {
    const cell = el("td", { class: "device-driver" });
    const reported = (...values) => values.some((value) => !missing(value));
    if (reported(device.nvml_utilisation, device.nvml_memory_used_bytes)) {
      cell.append(
        el("div", { class: "nvml-utilisation" }, missing(device.nvml_utilisation) ? null : meter(device.nvml_utilisation),
          `${percent(device.nvml_utilisation)} busy`),
        el("div", { class: "muted small nvml-memory" },
          `NVML #${device.nvml_index} · ${bytes(device.nvml_memory_used_bytes)} of ${bytes(device.nvml_memory_total_bytes)}`));
    }
    if (reported(device.tpu_duty_cycle, device.tpu_hbm_used_bytes)) {
      cell.append(
        el("div", { class: "tpu-duty-cycle" }, missing(device.tpu_duty_cycle) ? null : meter(device.tpu_duty_cycle),
          `${percent(device.tpu_duty_cycle)} duty cycle`),
        el("div", { class: "muted small tpu-hbm" },
          `libtpu · HBM ${bytes(device.tpu_hbm_used_bytes)} of ${bytes(device.tpu_hbm_total_bytes)}`));
    }
    if (!cell.childElementCount) cell.append(el("span", { class: "muted not-reported" }, NOT_REPORTED));
    return cell;
  }

  function deviceRow(report, device) {
    return el("tr", { class: "device-row", dataset: { deviceId: String(device.id) } },
      el("td", { class: "device-name" }, el("strong", {}, `#${device.id}`), " ", device.device_kind,
        el("div", { class: "muted small" }, device.platform)),
      el("td", { class: "device-host" }, report.hostname || NOT_REPORTED,
        el("div", { class: "muted small" },
          `process ${device.process_index}${missing(report.process_id) ? "" : ` · pid ${report.process_id}`}`)),
      bar(device.duty_cycle, "device-duty"),
      memoryCell(device),
      driverCell(device),
      el("td", { class: "device-mfu" }, missing(device.mfu)
        ? el("span", { class: "muted not-reported" }, NOT_REPORTED) : percent(device.mfu),
        // A CPU has no data sheet: its peak is a matmul the trainer timed, and the cell says so.
        report.peak_flops_source === "measured_matmul"
          ? el("div", { class: "muted small mfu-peak" }, "of a measured matmul's peak") : null),
    );
  }

  // The newest report of each live process by "hostname:pid", as a ProducerReport names its process.
  let processByWorker = new Map();

  function producerCpuNow(producer) {
    const process = processByWorker.get(producer.worker);
    return process ? `${process.cpu_cores.toFixed(2)} cores` : NOT_REPORTED;
  }

  function producersTable(producers) {
    if (producers === null) return el("p", { class: "muted small" }, "Producer processes: Redis could not be read.");
    if (!producers.length) return el("p", { class: "muted small" }, "No producer process has reported on this run yet.");
    const body = el("tbody");
    for (const producer of producers) {
      body.append(el("tr", { class: "producer-row" },
        el("td", {}, producer.worker),
        el("td", {}, String(producer.running_tasks)),
        el("td", {}, missing(producer.cpu_s) ? NOT_REPORTED : `${producer.cpu_s.toFixed(1)} s`),
        el("td", {}, bytes(producer.rss_bytes)),
        el("td", {}, ago(producer.reported_at)),
        el("td", { class: "producer-cpu-now" }, producerCpuNow(producer))));
    }
    return el("table", { class: "runs producers" },
      el("thead", {}, el("tr", {}, ...["Producer process", "Tasks running", "CPU time", "Resident memory",
        "Last report", "CPU now"].map((name) => el("th", {}, name)))),
      body);
  }

  function runCard(run) {
    const report = run.report;
    const head = el("div", { class: "run-header" },
      el("h2", {}, el("a", { href: run.url, class: "device-run-link" }, run.name || `run ${run.run}`)),
      el("span", { class: "muted" }, `in ${run.project}`),
      el("span", { class: `badge badge-${run.status}` }, run.status));
    const card = el("section", { class: "device-run", dataset: { runId: String(run.run) } }, head);
    if (!report) {
      card.append(el("p", { class: "muted" }, "No device report from the trainer yet."));
      card.append(producersTable(run.producers));
      return card;
    }
    head.append(el("span", { class: "muted small device-report-age" },
      `report of step ${run.step}, ${ago(report.reported_at)}`));
    const others = report.device_count - report.local_device_count;
    card.append(el("dl", { class: "facts device-host-facts" },
      figure("Host", report.hostname || NOT_REPORTED),
      figure("Host CPU", missing(report.host_cpu_percent) ? NOT_REPORTED : `${report.host_cpu_percent.toFixed(0)}%`),
      figure("Host memory", missing(report.host_memory_used_bytes) ? NOT_REPORTED
        : `${bytes(report.host_memory_used_bytes)} of ${bytes(report.host_memory_total_bytes)}`),
      figure("Trainer CPU", missing(report.process_cpu_cores) ? NOT_REPORTED
        : `${report.process_cpu_cores.toFixed(2)} cores`),
      figure("Trainer memory (RSS)", bytes(report.process_rss_bytes)),
      figure("Devices", `${report.local_device_count} here of ${report.device_count}`)));
    const body = el("tbody");
    for (const device of report.devices || []) body.append(deviceRow(report, device));
    card.append(el("table", { class: "runs devices" },
      el("thead", {}, el("tr", {}, ...["Device", "Host / process", "Duty cycle", "Memory (XLA allocator)",
        "NVML / libtpu", "MFU"].map((name) => el("th", {}, name)))),
      body));
    if (!(report.devices || []).length) {
      card.append(el("p", { class: "muted small" }, "This trainer's reports have no per-device rows (an older trainer)."));
    }
    if (others > 0) {
      card.append(el("p", { class: "muted small" },
        `${others} devices on other hosts are not listed: only the trainer process that posts telemetry reports.`));
    }
    card.append(producersTable(run.producers));
    return card;
  }

  function duration(seconds) {
    if (seconds < 90) return `${Math.round(seconds)} s`;
    if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
    if (seconds < 172800) return `${(seconds / 3600).toFixed(1)} h`;
    return `${(seconds / 86400).toFixed(1)} d`;
  }

  const ROLE_NAMES = window.tandemContracts.process_roles.labels;

  function processRow(process) {
    const cores = process.cpu_cores;
    const runs = el("td", { class: "process-runs" });
    for (const run of process.runs) runs.append(el("a", { href: run.url }, `run ${run.run}`), " ");
    if (process.other_runs) {
      runs.append(el("div", { class: "muted small process-other-runs" },
        `${process.other_runs} run${process.other_runs === 1 ? "" : "s"} of other projects`));
    }
    if (!runs.childNodes.length) runs.append(el("span", { class: "muted" }, "idle"));
    return el("tr", { class: "process-row", dataset: { role: process.role, pid: String(process.pid) } },
      el("td", { class: "process-role" }, el("strong", {}, ROLE_NAMES[process.role] || process.role),
        process.name ? el("div", { class: "muted small" }, process.name) : null),
      el("td", { class: "process-host" }, process.hostname, el("div", { class: "muted small" }, `pid ${process.pid}`)),
      el("td", { class: "process-uptime" }, duration(process.uptime_s)),
      el("td", { class: "process-cpu" }, meter(cores / process.host_cpu_count),
        el("span", { class: "meter-value" }, `${cores.toFixed(2)} of ${process.host_cpu_count} cores`)),
      el("td", { class: "process-rss" }, bytes(process.rss_bytes)),
      // Absent only on a process's first report (no earlier sample of the host to compare with).
      missing(process.host_cpu_percent) ? el("td", { class: "process-host-cpu muted not-reported" }, NOT_REPORTED)
        : el("td", { class: "process-host-cpu" }, meter(process.host_cpu_percent / 100),
          el("span", { class: "meter-value" }, `${process.host_cpu_percent.toFixed(0)}%`)),
      el("td", { class: "process-host-memory" },
        meter(process.host_memory_used_bytes / process.host_memory_total_bytes),
        el("span", { class: "meter-value" },
          `${bytes(process.host_memory_used_bytes)} of ${bytes(process.host_memory_total_bytes)}`)),
      runs,
      el("td", { class: "process-age" }, ago(process.reported_at)));
  }

  function drawProcesses(listing) {
    const processes = listing.processes;
    processByWorker = new Map((processes || []).map((process) => [`${process.hostname}:${process.pid}`, process]));
    if (!processesContainer) return;
    if (processes === null) {
      processesContainer.replaceChildren(el("p", { class: "muted" }, "Tandem processes: Redis could not be read."));
    } else if (!processes.length) {
      processesContainer.replaceChildren(el("p", { class: "muted" }, "No Tandem process has reported in the last few seconds."));
    } else {
      const body = el("tbody");
      for (const process of processes) body.append(processRow(process));
      processesContainer.replaceChildren(el("table", { class: "runs processes" },
        el("thead", {}, el("tr", {}, ...["Process", "Host", "Uptime", "CPU", "Memory (RSS)", "Host CPU",
          "Host memory", "Working on", "Last report"].map((name) => el("th", {}, name)))),
        body));
    }
    state.processDraws = (state.processDraws || 0) + 1;
  }

  function draw(runs) {
    container.replaceChildren(...runs.map(runCard));
    empty.hidden = runs.length > 0;
    state.draws += 1;
  }

  const getJson = (url) => fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });

  async function poll() {
    try {
      const [devices, processes] = await Promise.all([
        getJson(root.dataset.apiUrl),
        processesRoot ? getJson(processesRoot.dataset.apiUrl) : null,
      ]);
      if (devices.ok && (!processes || processes.ok)) {
        // Processes first: the producers' tables take their current CPU from them.
        if (processes) drawProcesses(await processes.json());
        draw(await devices.json());
        updated.textContent = `updated ${new Date().toLocaleTimeString()}`;
      } else {
        updated.textContent = `refresh failed (${devices.ok ? processes.status : devices.status})`;
      }
    } catch (error) {
      updated.textContent = "refresh failed (network)";
    }
    state.polls += 1;
    setTimeout(poll, REFRESH_MS);
  }

  const initialProcesses = document.getElementById("processes-initial");
  if (initialProcesses) drawProcesses(JSON.parse(initialProcesses.textContent));
  draw(JSON.parse(document.getElementById("devices-initial").textContent));
  setTimeout(poll, REFRESH_MS);
})();
