// Traces on the run page: the "Capture trace" action and the list of the run's traces.
//
// The trainer takes a requested trace at its next steps and uploads it, so the
// list is polled: often while a request is pending, rarely otherwise.
(function () {
  "use strict";
  const section = document.getElementById("traces");
  if (!section) return;
  const listUrl = section.dataset.listUrl;
  const body = section.querySelector("tbody");
  const error = document.getElementById("traces-error");
  const form = document.getElementById("trace-form");
  const PENDING_POLL_MS = 2000;
  const IDLE_POLL_MS = 15000;
  const TRACE = window.tandemContracts.trace_statuses.by_name; // the contracts' TraceStatus
  let timer = null;

  const state = (window.tandemRunTraces = { loads: 0, traces: [] });

  function cell(row, content) {
    const td = row.insertCell();
    if (content instanceof Node) td.appendChild(content);
    else td.textContent = content;
    return td;
  }

  function megabytes(bytes) {
    return bytes === null ? "—" : `${(bytes / 1e6).toFixed(1)} MB`;
  }

  function when(iso) {
    return iso ? new Date(iso).toLocaleString() : "—";
  }

  function render(traces) {
    body.replaceChildren();
    if (!traces.length) {
      cell(body.insertRow(), "No trace yet: capture one from the actions above.").colSpan = 7;
      return;
    }
    for (const trace of traces) {
      const row = body.insertRow();
      row.dataset.traceId = trace.id;
      row.dataset.status = trace.status;
      cell(row, `#${trace.id}`);
      cell(row, trace.steps);
      const badge = document.createElement("span");
      badge.className = `badge badge-trace-${trace.status}`;
      badge.textContent = trace.status;
      const status = cell(row, badge);
      if (trace.error) status.append(" ", trace.error);
      cell(row, when(trace.requested_at));
      cell(row, trace.first_step === null ? "—" : `${trace.first_step}–${trace.last_step}`);
      cell(row, megabytes(trace.size_bytes));
      if (trace.download_url) {
        const link = document.createElement("a");
        link.className = "button trace-download";
        link.href = trace.download_url;
        link.textContent = "Download zip";
        cell(row, link);
      } else {
        cell(row, "");
      }
    }
  }

  async function load() {
    clearTimeout(timer);
    try {
      const response = await fetch(`${listUrl}?page_size=50`, {
        credentials: "same-origin", headers: { Accept: "application/json" },
      });
      if (response.ok) {
        state.traces = (await response.json()).results;
        state.loads += 1;
        render(state.traces);
      }
    } finally {
      // Whatever happened (a network error included) one poll stays scheduled, and only one:
      // a load started by a submit may have overlapped a timer's.
      clearTimeout(timer);
      const pending = state.traces.some((trace) => trace.status === TRACE.REQUESTED);
      timer = setTimeout(() => load().catch(console.error), pending ? PENDING_POLL_MS : IDLE_POLL_MS);
    }
  }

  if (form) {
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      error.hidden = true;
      const response = await fetch(form.dataset.url, {
        method: "POST",
        credentials: "same-origin",
        headers: {
          Accept: "application/json",
          "Content-Type": "application/json",
          "X-CSRFToken": form.querySelector("[name=csrfmiddlewaretoken]").value,
        },
        body: JSON.stringify({ steps: Number(form.querySelector("[name=steps]").value) }),
      });
      if (!response.ok) {
        const answer = await response.json().catch(() => ({}));
        error.textContent = (answer.error && answer.error.message) || `Capture failed (HTTP ${response.status})`;
        error.hidden = false;
      }
      load().catch(console.error);
    });
  }

  load().catch(console.error);
})();
